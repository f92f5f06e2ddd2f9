// What a short nap costs on this machine (runs AL and AM, docs/BENCHMARKS.md): 200 sleeps
// of 4 µs (a host-flag wait's short nap) at the thread's default timer slack and at a slack
// of 1 µs (what that wait lowers it to), and 4,096 spin-loop hints (its fewest spins).
// rustc -O scripts/nap.rs -o .gpu/bin/nap   (links libc through std; no crates)
use std::time::{Duration, Instant};

unsafe extern "C" {
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
}
const PR_SET_TIMERSLACK: i32 = 29;
const PR_GET_TIMERSLACK: i32 = 30;

fn naps(label: &str) {
    let mut v: Vec<u128> = (0..200)
        .map(|_| {
            let t = Instant::now();
            std::thread::sleep(Duration::from_micros(4));
            t.elapsed().as_micros()
        })
        .collect();
    v.sort();
    println!("sleep(4us), {label}: p50 {} us, p10 {} p90 {}", v[100], v[20], v[180]);
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
