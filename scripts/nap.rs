// What a short nap costs on this machine (runs AL and AM, docs/BENCHMARKS.md): 200 sleeps
// of 4 µs (a host-flag wait's short nap) at the thread's default timer slack and at a slack
// of 1 µs (what that wait lowers it to), with the thread's CPU time over them (in a VM a
// short nap's timer exits count as the thread's), and 4,096 spin-loop hints (its fewest
// spins).
// rustc -O scripts/nap.rs -o .gpu/bin/nap   (links libc through std; no crates)
use std::time::{Duration, Instant};

unsafe extern "C" {
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
    fn clock_gettime(clock: i32, ts: *mut [i64; 2]) -> i32;
}
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

fn thread_cpu() -> Duration {
    let mut ts = [0i64; 2];
    // SAFETY: `ts` is a valid timespec (two longs) that the call writes.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts[0] as u64, ts[1] as u32)
}
const PR_SET_TIMERSLACK: i32 = 29;
const PR_GET_TIMERSLACK: i32 = 30;

fn naps(label: &str) {
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let mut v: Vec<u128> = (0..200)
        .map(|_| {
            let t = Instant::now();
            std::thread::sleep(Duration::from_micros(4));
            t.elapsed().as_micros()
        })
        .collect();
    let busy = 100.0 * (thread_cpu() - cpu).as_secs_f64() / wall.elapsed().as_secs_f64();
    v.sort();
    println!(
        "sleep(4us), {label}: p50 {} us, p10 {} p90 {}; thread CPU time {busy:.0} % of wall time",
        v[100], v[20], v[180]
    );
}

fn main() {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and only reads this thread's slack.
    let slack = unsafe { prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    naps(&format!("slack {slack} ns"));
    // SAFETY: PR_SET_TIMERSLACK takes a number of nanoseconds, changes this thread only.
    let set = unsafe { prctl(PR_SET_TIMERSLACK, 1_000, 0, 0, 0) };
    naps(&format!("slack 1000 ns (set: {set})"));
    let t = Instant::now();
    for _ in 0..4096 {
        std::hint::spin_loop();
    }
    println!("4096 pauses: {:?}", t.elapsed());
}
