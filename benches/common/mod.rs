//! Process plumbing shared by the benchmarks: pinning, peer processes, unique names.
#![allow(dead_code)] // each bench uses a subset

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable that names a peer's role.
pub const PEER: &str = "GPURING_BENCH_PEER";
/// The environment variable that passes a peer its segment (or socket) name.
pub const NAME: &str = "GPURING_BENCH_NAME";

/// CPUs from `GPURING_BENCH_CPUS` (this process first, then the peers).
pub fn cpus() -> Vec<usize> {
    std::env::var("GPURING_BENCH_CPUS")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Pins the calling thread to `cpu`, if given.
pub fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
    }
}

/// A peer process; killed and reaped on drop.
pub struct Peer(pub Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this binary as peer `role` with segment `name`; `stdio` pipes its stdin/stdout.
pub fn peer(role: &str, name: &str, index: usize, stdio: bool) -> Peer {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(PEER, role).env(NAME, name).env("GPURING_BENCH_PEER_INDEX", index.to_string());
    if stdio {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    }
    Peer(cmd.spawn().expect("spawn peer"))
}

/// A name no other benchmark (or run) uses.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("gpuring-bench-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The peer's index (which CPU of `GPURING_BENCH_CPUS` it takes, after the first).
pub fn peer_index() -> usize {
    std::env::var("GPURING_BENCH_PEER_INDEX").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A 4096-byte page of named shared memory holding a `T` made only of atomics (zeroed is
/// a valid `T`): the raw floors' shared words. The creator unlinks it on drop.
pub struct SharedPage<T> {
    ptr: *mut T,
    name: Option<String>,
}

impl<T> SharedPage<T> {
    /// Creates page `name` (exclusively).
    pub fn create(name: &str) -> Self {
        assert!(size_of::<T>() <= 4096);
        let fd = rustix::shm::open(
            name,
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        Self { ptr: Self::map(&fd), name: Some(name.to_owned()) }
    }

    /// Opens page `name`.
    pub fn open(name: &str) -> Self {
        assert!(size_of::<T>() <= 4096);
        let fd =
            rustix::shm::open(name, rustix::shm::OFlags::RDWR, rustix::fs::Mode::empty()).unwrap();
        Self { ptr: Self::map(&fd), name: None }
    }

    fn map(fd: &std::os::fd::OwnedFd) -> *mut T {
        // SAFETY: a fresh 4096-byte shared mapping; T fits (asserted by the callers).
        unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                4096,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
            .unwrap()
            .cast()
        }
    }

    /// The shared value.
    pub fn get(&self) -> &T {
        // SAFETY: mapped for the life of self, page aligned; T is atomics only, and zeroed
        // atomics are valid.
        unsafe { &*self.ptr }
    }
}

impl<T> Drop for SharedPage<T> {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = rustix::shm::unlink(name.as_str());
        }
    }
}
