//! Async endpoints (feature `async`): futures parked on the shared wait words, woken by
//! this process's waiter thread, under tokio and under a plain executor.
#![cfg(all(feature = "async", not(loom)))]

mod common;

use std::time::Duration;

use common::unique_name;
use gpuring::{Descriptor, MpmcRing, SpscRing};

fn d(seq: u64) -> Descriptor {
    Descriptor { seq, ..Default::default() }
}

#[test]
fn a_ring_pop_async_is_woken_by_a_push_from_another_thread() {
    let name = unique_name("async-ring");
    let ring = SpscRing::<Descriptor>::create(&name, 8).unwrap();
    let mut tx = ring.producer().unwrap();
    let mut rx = ring.consumer().unwrap();
    let pusher = std::thread::spawn(move || {
        for seq in 0..1000 {
            if seq % 100 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            tx.push(d(seq)).unwrap();
        }
    });
    futures::executor::block_on(async {
        for seq in 0..1000 {
            assert_eq!(rx.pop_async().await.unwrap().seq, seq);
        }
    });
    pusher.join().unwrap();
}

#[test]
fn an_mpmc_push_async_waits_for_room() {
    let name = unique_name("async-mpmc");
    let ring = MpmcRing::<Descriptor>::create(&name, 4).unwrap();
    let tx = ring.producer().unwrap();
    let rx = ring.consumer().unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let pushing = tokio::spawn(async move {
            for seq in 0..10_000 {
                tx.push_async(d(seq)).await.unwrap();
            }
        });
        for seq in 0..10_000 {
            assert_eq!(rx.pop_async().await.unwrap().seq, seq);
        }
        pushing.await.unwrap();
    });
}
