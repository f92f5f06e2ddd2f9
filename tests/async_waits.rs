//! Async endpoints (feature `async`): futures parked on the shared wait words, woken by
//! this process's waiter thread, under tokio (a multi-thread runtime with 2 workers) and
//! under a plain `futures` executor; across processes; cancelled; with dead peers; idle.
#![cfg(all(feature = "async", not(loom)))]

mod common;

use std::time::{Duration, Instant};

use common::{Peer, announce, die, now_ns, ring_name, role, unique_name};
use gpuring::internal::waiter_stats;
use gpuring::{
    AcquireError, Channel, Descriptor, MpmcRing, PopError, RecvError, Selectable, SpscRing,
    TensorMeta, select, select_async, select_timeout,
};

fn d(seq: u64) -> Descriptor {
    Descriptor { seq, ..Default::default() }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Waits until `cond`, failing after 10 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The futures are `Send` where their endpoints are, so that `tokio::spawn` takes them.
#[test]
fn the_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let name = unique_name("async-send");
    let ch = Channel::builder(&name).slots(2, 64).create().unwrap();
    let (mut tx, mut rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    send(&rx.recv_async());
    send(&tx.acquire_async());
    send(&rx.stream());
    let mut both = [&mut rx];
    send(&select_async(&mut both));
    let ring = MpmcRing::<Descriptor>::builder(unique_name("async-send-ring"))
        .capacity(4)
        .create()
        .unwrap();
    let (p, c) = (ring.producer().unwrap(), ring.consumer().unwrap());
    send(&p.push_async(d(0)));
    send(&c.pop_async());
    let mut buf = [d(0); 2];
    send(&p.push_slice_async(&[d(0)]));
    send(&p.push_slice_some_async(&[d(0)]));
    send(&c.pop_into_async(&mut buf));
}

#[test]
fn a_ring_pop_async_is_woken_by_a_push_from_another_thread() {
    let name = unique_name("async-ring");
    let ring = SpscRing::<Descriptor>::builder(&name).capacity(8).create().unwrap();
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
        // The producer has gone and everything was taken.
        assert_eq!(rx.pop_async().await, Err(PopError::Disconnected));
    });
    pusher.join().unwrap();
}

#[test]
fn an_mpmc_push_async_waits_for_room() {
    let name = unique_name("async-mpmc");
    let ring = MpmcRing::<Descriptor>::builder(&name).capacity(4).create().unwrap();
    let tx = ring.producer().unwrap();
    let rx = ring.consumer().unwrap();
    runtime().block_on(async move {
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

/// The slice forms: a tokio task pushes 20,000 numbers in slices of 100 through a ring of
/// 16 cells (so each slice waits for room many times) while a `futures` executor pops
/// them in buffers of 7; every number arrives once, in order. SPSC and MPMC.
#[test]
fn slices_move_through_async_waits() {
    const N: u64 = 20_000;
    fn check(mut pop: impl FnMut(&mut [u64]) -> Result<usize, PopError>) {
        let mut next = 0;
        let mut buf = [0u64; 7];
        loop {
            match pop(&mut buf) {
                Ok(n) => {
                    assert!(n > 0, "pop_into_async returned no element");
                    for &v in &buf[..n] {
                        assert_eq!(v, next);
                        next += 1;
                    }
                }
                Err(PopError::Disconnected) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(next, N);
    }
    let values: Vec<u64> = (0..N).collect();
    let rt = runtime();

    let ring = SpscRing::<u64>::builder(unique_name("async-slices")).capacity(16).create().unwrap();
    let (mut tx, mut rx) = (ring.producer().unwrap(), ring.consumer().unwrap());
    let vals = values.clone();
    let pushing = rt.spawn(async move {
        for chunk in vals.chunks(100) {
            tx.push_slice_async(chunk).await.unwrap();
        }
    });
    check(|buf| futures::executor::block_on(rx.pop_into_async(buf)));
    rt.block_on(pushing).unwrap();

    let ring =
        MpmcRing::<u64>::builder(unique_name("async-slices-mpmc")).capacity(16).create().unwrap();
    let (tx, rx) = (ring.producer().unwrap(), ring.consumer().unwrap());
    let pushing = rt.spawn(async move {
        let mut rest = &values[..];
        while !rest.is_empty() {
            let n = tx.push_slice_some_async(rest).await.unwrap();
            assert!(n > 0 && n <= 64, "one run: at least one, at most 64 cells");
            rest = &rest[n..];
        }
    });
    check(|buf| futures::executor::block_on(rx.pop_into_async(buf)));
    rt.block_on(pushing).unwrap();
}

/// A `push_slice_some_async` or `pop_into_async` dropped while it waits has moved nothing;
/// `push_slice_async` reports how many it pushed when the consumer has gone.
#[test]
fn dropped_slice_futures_move_nothing() {
    let ring =
        SpscRing::<u64>::builder(unique_name("async-slices-cancel")).capacity(4).create().unwrap();
    let (mut tx, mut rx) = (ring.producer().unwrap(), ring.consumer().unwrap());
    runtime().block_on(async {
        let mut buf = [0u64; 4];
        let r = tokio::time::timeout(Duration::from_millis(20), rx.pop_into_async(&mut buf)).await;
        assert!(r.is_err(), "nothing was pushed");
        assert_eq!(tx.push_slice_some_async(&[1, 2, 3, 4, 5, 6]).await, Ok(4));
        let r = tokio::time::timeout(Duration::from_millis(20), tx.push_slice_some_async(&[7, 8]))
            .await;
        assert!(r.is_err(), "the ring is full");
        assert_eq!(rx.pop_into_async(&mut buf).await, Ok(4));
        assert_eq!(buf, [1, 2, 3, 4]);
        assert_eq!(rx.len(), Some(0), "the dropped push put nothing in");
        assert_eq!(rx.pop_into_async(&mut []).await, Ok(0));
        assert_eq!(tx.push_slice_some_async(&[]).await, Ok(0));
    });
    // The consumer leaves; a push of 6 into 4 free cells reports the 4 it pushed.
    drop(rx);
    let r = runtime().block_on(tx.push_slice_async(&[1, 2, 3, 4, 5, 6]));
    assert_eq!(r, Err(gpuring::PushError::Disconnected(4)));
    // Those 4 are in the ring: a new consumer takes them, so that the ring goes with the
    // handles (one holding messages stays for a consumer to come).
    let mut rx = ring.consumer().unwrap();
    let mut buf = [0u64; 8];
    assert_eq!(rx.try_pop_into(&mut buf), Ok(4));
    assert_eq!(buf[..4], [1, 2, 3, 4]);
}

/// Host channel, two tasks: every message's bytes checked; a pool of 2 slots makes the
/// sender wait for slots, a ring of 2 for room.
#[test]
fn channel_send_async_and_recv_async_under_tokio() {
    const N: u64 = 20_000;
    let name = unique_name("async-ch");
    let ch = Channel::builder(&name).capacity(2).slots(2, 64).create().unwrap();
    let (mut tx, mut rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    runtime().block_on(async move {
        let sending = tokio::spawn(async move {
            for i in 0..N {
                let mut lease = tx.acquire_async().await.unwrap();
                lease[..8].copy_from_slice(&i.to_le_bytes());
                tx.send_async(lease, TensorMeta::bytes(8)).await.unwrap();
            }
        });
        for i in 0..N {
            let msg = rx.recv_async().await.unwrap();
            assert_eq!(msg.seq(), i);
            assert_eq!(u64::from_le_bytes(msg[..8].try_into().unwrap()), i);
        }
        sending.await.unwrap();
        // The sender has gone.
        assert!(matches!(rx.recv_async().await, Err(RecvError::Disconnected)));
    });
}

/// The stream of a receiver ends when every sender has left and all was received.
#[test]
fn a_receiver_stream_ends_once_the_senders_have_left() {
    use futures::StreamExt;
    let name = unique_name("async-stream");
    let ch = Channel::builder(&name).capacity(4).slots(4, 64).create().unwrap();
    let mut rx = ch.receiver().unwrap();
    let tx = ch.sender().unwrap();
    let sending = std::thread::spawn(move || {
        for i in 0..500u64 {
            let mut lease = tx.acquire().unwrap();
            lease[..8].copy_from_slice(&i.to_le_bytes());
            tx.send(lease, TensorMeta::bytes(8)).unwrap();
        }
    });
    let got = futures::executor::block_on(async {
        let mut got = Vec::new();
        let mut messages = rx.stream();
        while let Some(msg) = messages.next().await {
            got.push(u64::from_le_bytes(msg.unwrap()[..8].try_into().unwrap()));
        }
        got
    });
    sending.join().unwrap();
    assert_eq!(got, (0..500).collect::<Vec<_>>());
}

/// Cancel-safety: futures dropped while parked (a timeout, a losing `select!` branch) take
/// nothing and leak nothing; the next receive gets the message, the next acquire the slot.
#[test]
fn a_future_dropped_mid_wait_loses_nothing() {
    let name = unique_name("async-cancel");
    let ch = Channel::builder(&name).capacity(4).slots(1, 64).create().unwrap();
    let (mut tx, mut rx) = (ch.sender().unwrap(), ch.receiver().unwrap());
    runtime().block_on(async {
        // Parked, then dropped by the timeout.
        let r = tokio::time::timeout(Duration::from_millis(20), rx.recv_async()).await;
        assert!(r.is_err(), "nothing was sent");
        assert_eq!(waiting_receivers(&name), 0, "the dropped future left its parking");

        let mut lease = tx.acquire_async().await.unwrap();
        lease[0] = 42;
        // The only slot is out: acquiring parks; dropped by the timeout.
        let r = tokio::time::timeout(Duration::from_millis(20), tx.acquire_async()).await;
        assert!(r.is_err(), "the only slot is leased");
        tx.send_async(lease, TensorMeta::bytes(1)).await.unwrap();

        // A losing branch of select! is dropped; the message is still there.
        tokio::select! {
            biased;
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
            _ = tx.acquire_async() => panic!("no slot is free while the message is queued"),
        }
        let msg = rx.recv_async().await.unwrap();
        assert_eq!(msg[0], 42);
        drop(msg);
        // The slot came back: the pool is whole.
        let lease = tx.acquire_async().await.unwrap();
        drop(lease);
        assert_eq!(tx.free_slots(), 1);
    });
    assert_eq!(waiting_receivers(&name), 0);
}

/// Receivers registered as asleep on channel `name`'s ring.
fn waiting_receivers(name: &str) -> u32 {
    gpuring::inspect::inspect(name).unwrap().ring.unwrap().waiting_consumers
}

/// A sleeper count left by a parked future is given back when it is dropped, so that
/// senders make no needless wake-up syscalls.
#[test]
fn a_dropped_future_leaves_no_sleeper_behind() {
    let name = unique_name("async-sleepers");
    let ch = Channel::builder(&name).capacity(4).slots(2, 64).create().unwrap();
    let mut rx = ch.receiver().unwrap();
    let tx = ch.sender().unwrap();
    // Polls until the receive is parked (a close of the segment, e.g. by the sender's
    // attach, wakes a parked future to probe, and it parks again at its next poll).
    async fn parked(recv: &mut (impl std::future::Future + Unpin), name: &str) {
        for _ in 0..1000 {
            assert!(futures::poll!(&mut *recv).is_pending(), "nothing was sent");
            if waiting_receivers(name) == 1 {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the receive never parked");
    }
    futures::executor::block_on(async {
        let mut recv = Box::pin(rx.recv_async());
        parked(&mut recv, &name).await;
        drop(recv);
    });
    assert_eq!(waiting_receivers(&name), 0, "a sleeper was left");
    // And a future forgotten while parked gives it back once its word moves.
    futures::executor::block_on(async {
        let mut recv = Box::pin(rx.recv_async());
        parked(&mut recv, &name).await;
        std::mem::forget(recv);
    });
    let lease = tx.acquire().unwrap();
    tx.send(lease, TensorMeta::bytes(1)).unwrap();
    eventually("the waiter thread gives the sleeper back", || waiting_receivers(&name) == 0);
    // Taken, so that the channel (a message waiting keeps it) goes with the handles.
    drop(rx.recv().unwrap());
}

#[test]
fn select_takes_from_whichever_receiver_has_a_message() {
    let names: Vec<_> = (0..4).map(|i| unique_name(&format!("async-sel{i}"))).collect();
    let chans: Vec<_> = names
        .iter()
        .map(|n| Channel::builder(n).capacity(8).slots(8, 64).create().unwrap())
        .collect();
    let mut rxs: Vec<_> = chans.iter().map(|c| c.receiver().unwrap()).collect();
    let txs: Vec<_> = chans.iter().map(|c| c.sender().unwrap()).collect();
    {
        let mut live: Vec<_> = rxs.iter_mut().collect();
        assert!(select_timeout(&mut live, Duration::from_millis(10)).is_none(), "nothing sent");
    }
    let sending = std::thread::spawn(move || {
        for round in 0..50u8 {
            for (i, tx) in txs.iter().enumerate().rev() {
                std::thread::sleep(Duration::from_micros(200));
                let mut lease = tx.acquire().unwrap();
                lease[0] = i as u8;
                lease[1] = round;
                tx.send(lease, TensorMeta::bytes(2)).unwrap();
            }
        }
    });
    let mut seen = [0u32; 4];
    let mut live: Vec<_> = rxs.iter_mut().collect();
    let mut ids: Vec<usize> = (0..4).collect();
    while !live.is_empty() {
        match select(&mut live) {
            (i, Ok(msg)) => {
                assert_eq!(msg[0] as usize, ids[i], "from the receiver it names");
                assert_eq!(u32::from(msg[1]), seen[ids[i]], "in order");
                seen[ids[i]] += 1;
            }
            (i, Err(RecvError::Disconnected)) => {
                live.remove(i);
                ids.remove(i);
            }
            (i, Err(e)) => panic!("receiver {i}: {e}"),
        }
    }
    sending.join().unwrap();
    assert_eq!(seen, [50; 4]);
}

/// 64 channels served by one runtime of 2 workers, their senders in another process:
/// every message arrives exactly once, in order, bytes checked.
/// Ring consumers select too: an SPSC and an MPMC consumer of `u64` mixed as trait
/// objects, fed by two threads; each value comes from the ring it was pushed to, in order,
/// until both rings' producers have left. Then a homogeneous select under tokio.
#[test]
fn select_takes_from_ring_consumers() {
    type Pop = Result<u64, PopError>;
    let spsc =
        SpscRing::<u64>::builder(unique_name("async-sel-spsc")).capacity(8).create().unwrap();
    let mpmc =
        MpmcRing::<u64>::builder(unique_name("async-sel-mpmc")).capacity(8).create().unwrap();
    let (mut a, b) = (spsc.consumer().unwrap(), mpmc.consumer().unwrap());
    let (mut ta, tb) = (spsc.producer().unwrap(), mpmc.producer().unwrap());
    let mut b = b;
    {
        let mut live: Vec<&mut dyn Selectable<Output = Pop>> = vec![&mut a, &mut b];
        assert!(select_timeout(&mut live, Duration::from_millis(10)).is_none(), "nothing pushed");
    }
    const N: u64 = 2_000;
    let pa = std::thread::spawn(move || {
        for v in 0..N {
            if v % 200 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            ta.push(v).unwrap();
        }
    });
    let pb = std::thread::spawn(move || {
        for v in 0..N {
            if v % 300 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            tb.push(1_000_000 + v).unwrap();
        }
    });
    let mut next = [0u64, 1_000_000];
    let mut ids = vec![0usize, 1];
    let mut live: Vec<&mut dyn Selectable<Output = Pop>> = vec![&mut a, &mut b];
    while !live.is_empty() {
        match select(&mut live) {
            (i, Ok(v)) => {
                assert_eq!(v, next[ids[i]], "from the ring it was pushed to, in order");
                next[ids[i]] += 1;
            }
            (i, Err(PopError::Disconnected)) => {
                live.remove(i);
                ids.remove(i);
            }
            (i, Err(e)) => panic!("consumer {i}: {e}"),
        }
    }
    assert_eq!(next, [N, 1_000_000 + N], "everything arrived");
    pa.join().unwrap();
    pb.join().unwrap();

    // Homogeneous, async, under tokio: three SPSC rings, one value each.
    let rings: Vec<_> = (0..3)
        .map(|i| {
            SpscRing::<u64>::builder(unique_name(&format!("async-sel-r{i}")))
                .capacity(4)
                .create()
                .unwrap()
        })
        .collect();
    let mut rxs: Vec<_> = rings.iter().map(|r| r.consumer().unwrap()).collect();
    let mut txs: Vec<_> = rings.iter().map(|r| r.producer().unwrap()).collect();
    runtime().block_on(async {
        let mut live: Vec<_> = rxs.iter_mut().collect();
        let pushing = tokio::spawn(async move {
            for (i, tx) in txs.iter_mut().enumerate().rev() {
                tokio::time::sleep(Duration::from_millis(2)).await;
                tx.push_async(10 + i as u64).await.unwrap();
            }
            txs // kept until the selects are done, so that no ring says `Disconnected`
        });
        let mut got = Vec::new();
        for _ in 0..3 {
            let (i, v) = select_async(&mut live).await;
            assert_eq!(v, Ok(10 + i as u64), "from ring {i}");
            got.push(i);
        }
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2], "one value from each ring");
        drop(pushing.await.unwrap());
    });
}

#[test]
fn sixty_four_channels_across_processes_under_one_runtime() {
    const CHANNELS: usize = 64;
    const PER: u64 = 2_000;
    if role().as_deref() == Some("senders") {
        let base = ring_name();
        let chans: Vec<_> = (0..CHANNELS)
            .map(|i| Channel::builder(format!("{base}-{i}")).open().unwrap())
            .collect();
        let txs: Vec<_> = chans.iter().map(|c| c.sender().unwrap()).collect();
        announce("attached");
        for i in 0..PER {
            for (c, tx) in txs.iter().enumerate() {
                let mut lease = tx.acquire_timeout(Duration::from_secs(30)).unwrap();
                lease[..8].copy_from_slice(&i.to_le_bytes());
                lease[8] = c as u8;
                tx.send(lease, TensorMeta::bytes(9)).unwrap();
            }
            if i % 256 == 0 {
                std::thread::sleep(Duration::from_millis(1)); // let the receivers sleep
            }
        }
        return;
    }
    let base = unique_name("async-64");
    let chans: Vec<_> = (0..CHANNELS)
        .map(|i| {
            Channel::builder(format!("{base}-{i}")).capacity(16).slots(16, 64).create().unwrap()
        })
        .collect();
    let rxs: Vec<_> = chans.iter().map(|c| c.receiver().unwrap()).collect();
    let mut peer =
        Peer::spawn("sixty_four_channels_across_processes_under_one_runtime", "senders", &base);
    peer.expect("attached");
    let counts = runtime().block_on(async move {
        let tasks: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(c, mut rx)| {
                tokio::spawn(async move {
                    let mut n = 0u64;
                    loop {
                        match rx.recv_async().await {
                            Ok(msg) => {
                                assert_eq!(u64::from_le_bytes(msg[..8].try_into().unwrap()), n);
                                assert_eq!(msg[8] as usize, c, "from its own channel");
                                n += 1;
                            }
                            Err(RecvError::Disconnected) => return n,
                            Err(e) => panic!("channel {c}: {e}"),
                        }
                    }
                })
            })
            .collect();
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(t.await.unwrap());
        }
        counts
    });
    assert_eq!(peer.child.wait().unwrap().code(), Some(0));
    assert_eq!(counts, vec![PER; CHANNELS], "exactly once");
}

/// A sender peer: on each channel of `names`, sends one-byte messages 0, 1, ... (`count` of
/// them), waits `pause` (for the receiving side to go to sleep), then dies by SIGKILL.
fn send_bytes_then_die(names: &[String], count: u8, pause: Duration) -> ! {
    let chans: Vec<_> = names.iter().map(|n| Channel::builder(n).open().unwrap()).collect();
    let txs: Vec<_> = chans.iter().map(|c| c.sender().unwrap()).collect();
    for tx in &txs {
        for i in 0..count {
            let mut lease = tx.acquire().unwrap();
            lease[0] = i;
            tx.send(lease, TensorMeta::bytes(1)).unwrap();
        }
    }
    std::thread::sleep(pause);
    die();
}

/// A sender killed while a task awaits its next message: the task gets what it sent, then
/// `PeerDead`, told by the segment's close (no polling).
#[test]
fn peer_dead_arrives_through_recv_async() {
    if role().as_deref() == Some("sender") {
        // Then the receiver parks.
        send_bytes_then_die(&[ring_name()], 3, Duration::from_millis(100));
    }
    let name = unique_name("async-dead");
    let ch = Channel::builder(&name).capacity(8).slots(4, 64).create().unwrap();
    let mut rx = ch.receiver().unwrap();
    let mut peer = Peer::spawn("peer_dead_arrives_through_recv_async", "sender", &name);
    let (got, noticed) = runtime().block_on(async move {
        let mut got = Vec::new();
        loop {
            match rx.recv_async().await {
                Ok(msg) => got.push(msg[0]),
                Err(e) => return ((got, e), now_ns()),
            }
        }
    });
    let died = peer.died();
    assert_eq!(got.0, [0, 1, 2], "what it sent first");
    assert!(matches!(got.1, RecvError::PeerDead), "{:?}", got.1);
    common::assert_noticed("recv_async", died, noticed);
}

/// The blocking `select` sleeps on its sources' words itself (no parked future, no waiter
/// thread in between), and a sender's death still reaches it at once: the watcher thread's
/// close event wakes it to probe. Two threads select at once (each over a dying channel and
/// a silent one), and both hear of the death.
#[test]
fn select_sleeps_on_every_word_and_hears_of_a_death() {
    if role().as_deref() == Some("sender") {
        let name = ring_name();
        // Then the selects sleep.
        send_bytes_then_die(&[name.clone(), format!("{name}-2")], 2, Duration::from_millis(200));
    }
    if role().is_none() {
        // The selects run in a process of their own, so that no other test's futures or
        // waiter threads are counted with theirs.
        let mut selector =
            Peer::spawn("select_sleeps_on_every_word_and_hears_of_a_death", "selector", "-");
        assert_eq!(selector.child.wait().unwrap().code(), Some(0), "the selector failed");
        return;
    }
    let name = unique_name("sel-dead");
    let dying = [name.clone(), format!("{name}-2")];
    let quiet = [unique_name("sel-quiet"), unique_name("sel-quiet-2")];
    let make = |n: &String| Channel::builder(n).capacity(8).slots(4, 64).create().unwrap();
    let (dying_ch, quiet_ch) = (dying.each_ref().map(make), quiet.each_ref().map(make));
    let _quiet_tx = quiet_ch.each_ref().map(|c| c.sender().unwrap()); // alive, silent
    let mut peer = Peer::spawn("select_sleeps_on_every_word_and_hears_of_a_death", "sender", &name);
    let watching = std::thread::spawn({
        let names: Vec<String> = dying.iter().chain(&quiet).cloned().collect();
        move || {
            // While the selects sleep, each is registered on both its rings, and no future
            // is parked.
            eventually("the selects sleep on all four words", || {
                names.iter().all(|n| waiting_receivers(n) == 1)
            });
            waiter_stats()
        }
    });
    let selects: Vec<_> = dying_ch
        .iter()
        .zip(&quiet_ch)
        .map(|(d, q)| {
            let (mut rd, mut rq) = (d.receiver().unwrap(), q.receiver().unwrap());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let mut live = [&mut rd, &mut rq];
                    match select_timeout(&mut live, Duration::from_secs(10)).expect("within 10 s") {
                        (0, Ok(msg)) => got.push(msg[0]),
                        (0, Err(e)) => return (got, e, now_ns()),
                        (i, r) => {
                            panic!("a quiet channel answered ({i}): {:?}", r.map(|m| m.len()))
                        }
                    }
                }
            })
        })
        .collect();
    let results: Vec<_> = selects.into_iter().map(|t| t.join().unwrap()).collect();
    let died = peer.died();
    for (got, err, noticed) in results {
        assert_eq!(got, [0, 1], "what it sent first");
        assert!(matches!(err, RecvError::PeerDead), "{err:?}");
        common::assert_noticed("select", died, noticed);
    }
    let asleep = watching.join().unwrap();
    assert_eq!((asleep.parked, asleep.threads), (0, 0), "no future parked, no waiter thread");
    assert_eq!(waiter_stats().threads, 0, "no waiter thread was ever started");
    for n in dying.iter().chain(&quiet) {
        assert_eq!(waiting_receivers(n), 0, "{n}: unregistered");
    }
}

/// Past 127 sources the blocking select waits through the waiter threads: still correct.
#[test]
fn select_over_more_sources_than_one_futex_waitv_takes() {
    let rings: Vec<_> = (0..130)
        .map(|i| {
            SpscRing::<u64>::builder(unique_name(&format!("sel-many{i}")))
                .capacity(2)
                .create()
                .unwrap()
        })
        .collect();
    let mut rxs: Vec<_> = rings.iter().map(|r| r.consumer().unwrap()).collect();
    let mut tx = rings[128].producer().unwrap();
    // The others have a producer that stays, silent.
    let _others: Vec<_> = rings
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 128)
        .map(|(_, r)| r.producer().unwrap())
        .collect();
    let pushing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        tx.push(7).unwrap();
        tx
    });
    let mut live: Vec<_> = rxs.iter_mut().collect();
    assert_eq!(select_timeout(&mut live, Duration::from_secs(10)), Some((128, Ok(7))));
    drop(pushing.join().unwrap());
}

/// A receiver killed holding every slot while the sender's task awaits a free one: the
/// task gets its slots back (taken from the dead), or `PeerDead` when none can come.
#[test]
fn peer_dead_arrives_through_acquire_async() {
    if role().as_deref() == Some("receiver") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        let held: Vec<_> = (0..2).map(|_| rx.recv().unwrap()).collect();
        announce("holding");
        std::thread::sleep(Duration::from_millis(100));
        let _ = held;
        die();
    }
    let name = unique_name("async-dead-rx");
    let ch = Channel::builder(&name).capacity(8).slots(2, 64).create().unwrap();
    let mut tx = ch.sender().unwrap();
    let mut peer = Peer::spawn("peer_dead_arrives_through_acquire_async", "receiver", &name);
    for _ in 0..2 {
        let lease = tx.acquire().unwrap();
        tx.send(lease, TensorMeta::bytes(1)).unwrap();
    }
    peer.expect("holding");
    let (r, noticed) = runtime().block_on(async move {
        let r = tx.acquire_async().await.map(drop);
        (r, now_ns())
    });
    let died = peer.died();
    // Every receiver died: the slots it held come back to a sender that waits for one
    // (the blocking form does the same at its tick).
    match r {
        Ok(()) | Err(AcquireError::PeerDead) => {}
        Err(e) => panic!("{e}"),
    }
    common::assert_noticed("acquire_async", died, noticed);
}

/// 1,000 receivers parked in tasks cost no CPU: measured over a second, in a process of
/// its own (the other tests of this binary run beside it).
#[test]
fn a_thousand_idle_receivers_cost_no_cpu() {
    const N: usize = 1000;
    if role().as_deref() != Some("idle") {
        let mut peer = Peer::spawn("a_thousand_idle_receivers_cost_no_cpu", "idle", "-");
        let used = peer.expect("cpu");
        println!("1,000 idle receivers: {used} of CPU over 1 s");
        assert_eq!(peer.child.wait().unwrap().code(), Some(0));
        return;
    }
    let base = unique_name("async-idle");
    let chans: Vec<_> = (0..N)
        .map(|i| Channel::builder(format!("{base}-{i}")).capacity(2).slots(1, 64).create().unwrap())
        .collect();
    let rxs: Vec<_> = chans.iter().map(|c| c.receiver().unwrap()).collect();
    let txs: Vec<_> = chans.iter().map(|c| c.sender().unwrap()).collect();
    let rt = runtime();
    let tasks: Vec<_> = rxs
        .into_iter()
        .map(|mut rx| rt.spawn(async move { rx.recv_async().await.map(|m| m[0]) }))
        .collect();
    eventually("every receive parked", || waiter_stats().parked == N);
    let stats = waiter_stats();
    assert!(stats.threads >= N.div_ceil(127), "{stats:?}");
    assert_eq!(stats.watched_segments, N, "{stats:?}");
    let before = cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time() - before;
    announce(&format!("cpu {used:?}"));
    assert!(used < Duration::from_millis(10), "idle receivers used {used:?} of CPU in 1 s");
    // And they all still work.
    for (i, tx) in txs.iter().enumerate() {
        let mut lease = tx.acquire().unwrap();
        lease[0] = i as u8;
        tx.send(lease, TensorMeta::bytes(1)).unwrap();
    }
    rt.block_on(async {
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().unwrap(), i as u8);
        }
    });
}

/// Process CPU time (user + system) so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given; zeroes are a valid rusage.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
