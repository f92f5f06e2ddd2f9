//! Helpers for tests that run as several processes: the test binary re-executes itself,
//! running one test with a role taken from the environment.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::{Child, Command};
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
pub fn spawn(test: &str, role: &str, ring: &str, env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    // --include-ignored: GPU tests are #[ignore]d off the GPU machine, and their peers
    // must run when the parent does.
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
        .env(ROLE, role)
        .env(RING, ring);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn peer process")
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
