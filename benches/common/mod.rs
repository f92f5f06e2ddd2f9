//! Process plumbing shared by the benchmarks: pinning, peer processes, unique names.
#![allow(dead_code)] // each bench uses a subset

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod baselines;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod floor;
pub mod ice;

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

impl Peer {
    /// Reaps a peer that was told to stop, once it has exited by itself (up to 5 s; then
    /// it is killed): it must take the stop message with it, because a ring or channel
    /// left with a message in it outlives its handles and would stay in /dev/shm.
    pub fn finish(mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !matches!(self.0.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(1));
        }
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

/// Criterion as the multi-process benches run it: 1 s warm-up, 3 s measurement, 20
/// samples, then the command line's options.
pub fn criterion() -> criterion::Criterion {
    criterion::Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args()
}

/// A stream consumer: reads items of `size` bytes, each carrying its sequence number first
/// (checked), runs `each` on it, and acknowledges an item whose byte 8 is 1 by writing the
/// count so far; until the stream ends.
pub fn numbered_sink(
    mut r: impl std::io::Read,
    mut w: impl std::io::Write,
    size: usize,
    mut each: impl FnMut(&[u8]),
) {
    let mut buf = vec![0u8; size];
    let mut expected = 0u64;
    while r.read_exact(&mut buf).is_ok() {
        each(&buf);
        assert_eq!(buf[..8], expected.to_le_bytes(), "bad item");
        expected += 1;
        if buf[8] == 1 {
            w.write_all(&expected.to_le_bytes()).unwrap();
            w.flush().unwrap();
        }
    }
}

/// A name no other benchmark (or run) uses.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    // A bench killed mid-run (a timeout, Ctrl-C) leaves its rings and channels: the first
    // name of a run removes those of earlier runs that no process has open.
    SWEPT.call_once(|| drop(gpuring::inspect::clean(false, true, "gpuring-bench-")));
    format!("gpuring-bench-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The peer's index (which CPU of `GPURING_BENCH_CPUS` it takes, after the first).
pub fn peer_index() -> usize {
    std::env::var("GPURING_BENCH_PEER_INDEX").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Named shared memory (whole 4096-byte pages) holding a `T` made only of atomics (zeroed
/// is a valid `T`): the raw floors' shared words. The creator unlinks it on drop.
pub struct SharedPage<T> {
    ptr: *mut T,
    name: Option<String>,
}

impl<T> SharedPage<T> {
    /// Creates page `name` (exclusively).
    pub fn create(name: &str) -> Self {
        let fd = rustix::shm::open(
            name,
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, Self::LEN as u64).unwrap();
        Self { ptr: Self::map(&fd), name: Some(name.to_owned()) }
    }

    /// Opens page `name`.
    pub fn open(name: &str) -> Self {
        let fd =
            rustix::shm::open(name, rustix::shm::OFlags::RDWR, rustix::fs::Mode::empty()).unwrap();
        Self { ptr: Self::map(&fd), name: None }
    }

    /// The mapping's length: `T`'s size in whole pages.
    const LEN: usize = size_of::<T>().next_multiple_of(4096);

    fn map(fd: &std::os::fd::OwnedFd) -> *mut T {
        // SAFETY: a fresh shared mapping of LEN bytes, which T fits.
        unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
            .unwrap()
            .cast()
        }
    }

    /// The mapping: its first byte and its length (whole pages).
    pub fn mapping(&self) -> (*mut u8, usize) {
        (self.ptr.cast(), Self::LEN)
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

// ---------------------------------------------------------------------------------------
// Percentiles beside criterion's medians.

/// What criterion measures per case, with a second pass for the tail: after criterion's
/// measurement of a case, the same batch function runs again with batches of one item,
/// each timed on its own, for up to [`Samples::BUDGET`] (at most [`Samples::MAX`] items).
/// Those samples give the p50 and p99 printed at the end of the run and written, one row
/// per item, to `target/criterion/samples-<bench>.csv` (`payload_bytes,path,<measure>_ns`;
/// `scripts/plot_latency.py` draws them). Criterion's own figure for the case stays its
/// median over batches. A filter argument (as for criterion) skips the other cases' pass;
/// `--test` takes three samples and writes nothing.
pub struct Samples {
    bench: &'static str,
    measure: &'static str,
    filter: Option<String>,
    test: bool,
    csv: String,
    rows: Vec<(String, usize, Duration, Duration, usize)>,
}

impl Samples {
    /// Longest second pass per case.
    pub const BUDGET: Duration = Duration::from_millis(1500);
    /// Most samples per case.
    pub const MAX: usize = 20_000;

    /// For bench `bench`, whose single-item batches measure `measure` (the CSV column is
    /// `<measure>_ns`), reading the filter from the command line as criterion does.
    pub fn new(bench: &'static str, measure: &'static str) -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        // Criterion's options that take a value; anything else starting with '-' is a flag.
        const VALUED: &[&str] = &[
            "--save-baseline",
            "-s",
            "--baseline",
            "-b",
            "--baseline-lenient",
            "--load-baseline",
            "--sample-size",
            "--warm-up-time",
            "--measurement-time",
            "--nresamples",
            "--noise-threshold",
            "--confidence-level",
            "--significance-level",
            "--profile-time",
            "--color",
            "-c",
            "--output-format",
            "--plotting-backend",
            "--format",
        ];
        let mut filter = None;
        let mut i = 0;
        while i < args.len() {
            if VALUED.contains(&args[i].as_str()) {
                i += 1;
            } else if !args[i].starts_with('-') && filter.is_none() {
                filter = Some(args[i].clone());
            }
            i += 1;
        }
        let test = args.iter().any(|a| a == "--test");
        Self { bench, measure, filter, test, csv: String::new(), rows: Vec::new() }
    }

    /// Runs the second pass for case `id` (`group/label`) carrying `payload` bytes, unless the
    /// filter excludes it. `batch(n)` runs `n` items and returns the time they took.
    pub fn sample(&mut self, id: &str, payload: usize, mut batch: impl FnMut(u64) -> Duration) {
        if !self.selected(id) {
            return;
        }
        let (max, budget) = if self.test { (3, Duration::MAX) } else { (Self::MAX, Self::BUDGET) };
        let start = Instant::now();
        let mut v = Vec::with_capacity(max);
        while v.len() < max && start.elapsed() < budget {
            v.push(batch(1));
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
        let path = id.rsplit('/').next().unwrap_or(id);
        for d in &v {
            self.csv.push_str(&format!("{payload},{path},{}\n", d.as_nanos()));
        }
        self.rows.push((id.to_owned(), payload, at(0.5), at(0.99), v.len()));
    }

    /// Whether the bench runs in test mode (`--test`: a few items a case, nothing written).
    pub fn testing(&self) -> bool {
        self.test
    }

    /// Whether the filter (if any) selects case `id`. Criterion reads the filter as a regex;
    /// here `a|b|c` (alternatives of plain substrings) selects the same cases.
    pub fn selected(&self, id: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| f.split('|').any(|alt| id.contains(alt)))
    }

    /// Prints the p50/p99 table (lines start with `p99 `) and writes the CSV.
    pub fn finish(self) {
        println!("\nsingle-item samples ({} per item, second pass after criterion):", self.measure);
        for (id, _, p50, p99, n) in &self.rows {
            println!("p99 {id}: p50 {p50:.2?}, p99 {p99:.2?} (n={n})");
        }
        if self.test || self.rows.is_empty() {
            return;
        }
        let dir = std::path::PathBuf::from(
            std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()),
        )
        .join("criterion");
        let path = dir.join(format!("samples-{}.csv", self.bench));
        let csv = format!("payload_bytes,path,{}_ns\n{}", self.measure, self.csv);
        match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, csv)) {
            Ok(()) => println!("samples written to {}", path.display()),
            Err(e) => eprintln!("could not write {}: {e}", path.display()),
        }
    }
}

/// A criterion group whose cases also get [`Samples`]' second pass.
pub struct Group<'a> {
    /// The criterion group (for cases without a second pass).
    pub g: criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>,
    name: String,
    samples: &'a mut Samples,
}

impl<'a> Group<'a> {
    /// Group `name` of `c`, its second passes recorded in `samples`.
    pub fn new(c: &'a mut criterion::Criterion, samples: &'a mut Samples, name: &str) -> Self {
        Self { g: c.benchmark_group(name), name: name.to_owned(), samples }
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the bench runs in test mode (`--test`).
    pub fn testing(&self) -> bool {
        self.samples.testing()
    }

    /// Whether the command line's filter selects case `label` of this group.
    pub fn selected(&self, label: &str) -> bool {
        self.samples.selected(&format!("{}/{label}", self.name))
    }

    /// Case `label`: criterion times `batch(iters)`, then the second pass samples `batch(1)`.
    pub fn run(&mut self, label: &str, payload: usize, mut batch: impl FnMut(u64) -> Duration) {
        self.g.bench_function(label, |b| b.iter_custom(&mut batch));
        self.samples.sample(&format!("{}/{label}", self.name), payload, batch);
    }
}
