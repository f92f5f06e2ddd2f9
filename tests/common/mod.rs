//! Helpers for tests that run as several processes: the test binary re-executes itself,
//! running one test with a role taken from the environment.
#![allow(dead_code)] // each test binary uses a different subset

pub mod counting;
#[cfg(all(feature = "cuda", not(loom)))]
pub mod gpu;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const ROLE: &str = "GPURING_TEST_ROLE";
const RING: &str = "GPURING_TEST_RING";

/// The role this process plays, when it was started by [`spawn`].
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// The ring name the parent passed down.
pub fn ring_name() -> String {
    std::env::var(RING).expect("started by spawn()")
}

/// A segment name no other test (or test run) uses.
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("gpuring-test-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Starts this test binary running only `test` (its full path in the binary) as `role`.
/// Its standard output (the test harness's lines, which would interleave with ours) goes
/// nowhere; its standard error (a panic's message) comes through.
pub fn spawn(test: &str, role: &str, ring: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    // --include-ignored: GPU tests are #[ignore]d off the GPU machine, and their peers
    // must run when the parent does.
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
        .env(ROLE, role)
        .env(RING, ring)
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    only_sees(&mut cmd);
    cmd.spawn().expect("spawn peer process")
}

/// `GPURING_TEST_PEER_ONLY_SEES=N` (GPU tests, a machine with two GPUs): the peer
/// processes see GPU `N` alone (`CUDA_VISIBLE_DEVICES`, as Ray gives an actor its GPU), so
/// that every cross-process GPU test has one end that cannot see the other's GPU.
fn only_sees(cmd: &mut Command) {
    if let Ok(v) = std::env::var("GPURING_TEST_PEER_ONLY_SEES") {
        cmd.env("CUDA_VISIBLE_DEVICES", v);
    }
}

/// Waits for every child to exit successfully. A watchdog: past `limit` all are killed and
/// the test fails, so a deadlock is a failure, not a hang.
pub fn wait_all(children: &mut [Child], limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut done = vec![None; children.len()];
    while done.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if done[i].is_none() {
                done[i] = c.try_wait().expect("try_wait");
            }
        }
        if Instant::now() > deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("watchdog: peers still running after {limit:?} (exits so far: {done:?})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (i, status) in done.into_iter().enumerate() {
        let status = status.unwrap();
        assert!(status.success(), "peer {i} failed: {status}");
    }
}

/// Polls `cond` until it holds; panics (a test failure, not a hang) after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "watchdog: {what} did not happen within {limit:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------------------
// Peers that die on purpose (tests/liveness.rs, tests/faults.rs).

/// Monotonic nanoseconds, comparable between processes of this machine.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Tells the parent `what` (a line on stdout, flushed).
pub fn announce(what: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "GPURING:{what}").unwrap();
    out.flush().unwrap();
}

/// Announces the death, then dies by SIGKILL: no destructor, no unlink, no unlock.
pub fn die() -> ! {
    announce(&format!("dying {}", now_ns()));
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
        .unwrap();
    unreachable!("SIGKILL is not caught");
}

/// A peer running `test` as `role`, its stdout piped to us.
pub struct Peer {
    /// The process.
    pub child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Peer {
    pub fn spawn(test: &str, role: &str, name: &str) -> Self {
        Self::spawn_with(test, role, name, &[])
    }

    /// As [`spawn`](Self::spawn), with extra environment variables.
    pub fn spawn_with(test: &str, role: &str, name: &str, env: &[(&str, String)]) -> Self {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        // --include-ignored: GPU tests are #[ignore]d off the GPU machine.
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
            .env(ROLE, role)
            .env(RING, name)
            .stdout(Stdio::piped());
        only_sees(&mut cmd);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The next line the peer announced with `GPURING:`, without the prefix.
    pub fn expect(&mut self, what: &str) -> String {
        for line in self.lines.by_ref() {
            let line = line.unwrap();
            // libtest may have printed the test's name on the same line.
            if let Some(rest) = line.split_once("GPURING:").map(|(_, rest)| rest) {
                assert!(rest.starts_with(what), "peer said {rest:?}, expected {what:?}");
                return rest[what.len()..].trim().to_owned();
            }
        }
        panic!("peer closed its stdout before saying {what:?}");
    }

    /// The next line the peer announced with `GPURING:`, without the prefix; `None` once
    /// its stdout is closed.
    pub fn next_line(&mut self) -> Option<String> {
        for line in self.lines.by_ref() {
            let line = line.unwrap();
            if let Some((_, rest)) = line.split_once("GPURING:") {
                return Some(rest.trim().to_owned());
            }
        }
        None
    }

    /// Waits for the announced death; returns its monotonic time. Checks that the peer
    /// was really killed by SIGKILL.
    pub fn died(&mut self) -> u64 {
        let at: u64 = self.expect("dying").parse().unwrap();
        self.killed();
        at
    }

    /// Waits for the peer to exit, and checks that SIGKILL ended it.
    pub fn killed(&mut self) {
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "the peer must die by SIGKILL: {status}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn assert_noticed(what: &str, died_at: u64, noticed_at: u64) {
    let ms = noticed_at.saturating_sub(died_at) as f64 / 1e6;
    println!("{what}: noticed {ms:.1} ms after the death");
    assert!(ms < 100.0, "{what}: death noticed after {ms:.1} ms (limit 100 ms)");
}

/// Aborts the whole test process, saying `what`, unless dropped within `limit`: for tests
/// that block without a timeout of their own (`iter()`), so that a bug is a failure, not a
/// hang.
pub struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

pub fn watchdog(what: &'static str, limit: Duration) -> Watchdog {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        while !flag.load(Ordering::Relaxed) {
            if Instant::now() > deadline {
                eprintln!("watchdog: {what} did not finish within {limit:?}");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    Watchdog(done)
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a storm's receivers got: every message number with how often it came, and how
/// often as a redelivery.
#[derive(Default)]
pub struct Deliveries(std::collections::HashMap<u64, (u32, u32)>);

impl Deliveries {
    pub fn note(&mut self, tag: u64, redelivered: bool) {
        let e = self.0.entry(tag).or_default();
        e.0 += 1;
        e.1 += u32::from(redelivered);
    }

    /// Whether `tag` came.
    pub fn has(&self, tag: u64) -> bool {
        self.0.contains_key(&tag)
    }

    /// A peer's `got <tag> <redelivered>` lines.
    pub fn note_line(&mut self, line: &str) {
        let mut words = line.strip_prefix("got ").expect("a got line").split(' ');
        let tag = words.next().unwrap().parse().unwrap();
        self.note(tag, words.next() == Some("true"));
    }

    /// Every message of `0..sent` came at least once, and each extra copy of one was
    /// marked a redelivery; nothing else came. Returns how many came again.
    pub fn check(&self, sent: u64, what: &str) -> u32 {
        assert!(self.0.keys().all(|&t| t < sent), "{what}: a message nobody sent");
        self.check_each(0..sent, what)
    }

    /// Every message of `sent` came at least once, and each extra copy of any message was
    /// marked a redelivery. Returns how many came again.
    pub fn check_each(&self, sent: impl IntoIterator<Item = u64>, what: &str) -> u32 {
        let sent: Vec<u64> = sent.into_iter().collect();
        let lost: Vec<u64> = sent.iter().copied().filter(|t| !self.0.contains_key(t)).collect();
        assert!(lost.is_empty(), "{what}: {} of {} lost: {lost:?}", lost.len(), sent.len());
        let mut again = 0;
        for (tag, &(n, redelivered)) in &self.0 {
            assert!(
                redelivered >= n - 1,
                "{what}: message {tag} came {n} times, {redelivered} marked"
            );
            again += redelivered;
        }
        again
    }

    /// The messages that came (each once).
    pub fn tags(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.keys().copied()
    }
}

/// Every object in /dev/shm of channel `name`: itself and its pools.
pub fn leftovers_of(name: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f == name || f.starts_with(&format!("{name}.")))
        .collect();
    found.sort();
    found
}

/// Spawns `role` of `test` (with `env`), and reads its announcements on a thread, handing
/// each line (without its prefix) to `each`: for storms, whose peers say much while they
/// run (a full pipe would slow them down). Returns the process, to kill, and the reader, to
/// join once it is dead.
pub fn spawn_reading(
    test: &str,
    role: &str,
    name: &str,
    env: &[(&str, String)],
    mut each: impl FnMut(&str) + Send + 'static,
) -> (Child, std::thread::JoinHandle<()>) {
    let mut peer = Peer::spawn_with(test, role, name, env);
    // A stand-in for the peer's own (its drop kills and reaps it): a process that exited.
    let mut exited = Command::new("true").spawn().unwrap();
    exited.wait().unwrap();
    let child = std::mem::replace(&mut peer.child, exited);
    let reader = std::thread::spawn(move || {
        while let Some(line) = peer.next_line() {
            each(&line);
        }
    });
    (child, reader)
}

/// A small xorshift generator for storms' random timings (seeded from the process id by
/// [`Rand::from_pid`], so runs differ).
pub struct Rand(pub u64);

impl Rand {
    /// Seeded with `seed` mixed with this process's id.
    pub fn from_pid(seed: u64) -> Self {
        Self(seed ^ u64::from(std::process::id()))
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
