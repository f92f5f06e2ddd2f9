// What a short nap costs on this machine (run AL, docs/BENCHMARKS.md): 200 sleeps of 4 µs
// (the first nap of a host-flag wait), and 4,096 spin-loop hints (its fewest spins).
// rustc -O scripts/nap.rs -o .gpu/bin/nap
use std::time::{Duration, Instant};
fn main() {
    let mut v: Vec<u128> = (0..200)
        .map(|_| {
            let t = Instant::now();
            std::thread::sleep(Duration::from_micros(4));
            t.elapsed().as_micros()
        })
        .collect();
    v.sort();
    println!("sleep(4us): p50 {} us, p10 {} p90 {}", v[100], v[20], v[180]);
    let t = Instant::now();
    for _ in 0..4096 {
        std::hint::spin_loop();
    }
    println!("4096 pauses: {:?}", t.elapsed());
}
