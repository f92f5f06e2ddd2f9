//! Loom models of the ring algorithms over heap storage.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom`. Each model explores
//! every interleaving (and every weak-memory outcome loom models) up to a preemption bound:
//! `LOOM_MAX_PREEMPTIONS` if set, otherwise the bound named in the model.
#![cfg(loom)]

use loom::model::Builder;
use loom::thread;

use gpuring::internal::{mpmc, repair, spsc};
use gpuring::{TryPopError, TryPushError};

fn builder(default_bound: usize) -> Builder {
    let mut b = Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(default_bound);
    }
    // Retry loops (a consumer polling an empty ring) add branches on every turn.
    b.max_branches = b.max_branches.max(100_000);
    b
}

/// One producer, one consumer, capacity 2, three elements: the ring wraps and fills.
/// Every element arrives once, in order, unchanged.
#[test]
fn spsc_no_loss_no_duplicate_fifo() {
    builder(3).check(|| {
        let (mut tx, mut rx) = spsc::with_capacity::<u64>(2);
        let producer = thread::spawn(move || {
            for v in 1..=3u64 {
                let mut item = v * 11;
                loop {
                    match tx.try_push(item) {
                        Ok(()) => break,
                        Err(TryPushError::Full(back)) => {
                            item = back;
                            thread::yield_now();
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            match rx.try_pop() {
                Ok(v) => got.push(v),
                Err(TryPopError::Empty) => thread::yield_now(),
                Err(e) => panic!("{e:?}"),
            }
        }
        producer.join().unwrap();
        assert_eq!(got, [11, 22, 33]);
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    });
}

/// Moves an empty ring's positions forward by `n` (push, pop), so that a model starts in
/// the middle of a lap and its elements wrap around the end of the cell array.
fn advance(tx: &mpmc::HeapProducer<u64>, rx: &mpmc::HeapConsumer<u64>, n: usize) {
    for _ in 0..n {
        tx.try_push(0).unwrap();
        rx.try_pop().unwrap();
    }
}

/// Pops whatever is left, after every thread has been joined.
fn drain(rx: &mpmc::HeapConsumer<u64>) -> Vec<u64> {
    let mut rest = Vec::new();
    loop {
        match rx.try_pop() {
            Ok(v) => rest.push(v),
            Err(TryPopError::Empty) => return rest,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Up to `attempts` pops, without waiting: no retry loops, so the model stays finite.
fn pop_some(rx: &mpmc::HeapConsumer<u64>, attempts: usize) -> Vec<u64> {
    let mut got = Vec::new();
    for _ in 0..attempts {
        match rx.try_pop() {
            Ok(v) => got.push(v),
            Err(TryPopError::Empty) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    got
}

/// Per-producer FIFO (producer = value / 10, its sequence = value % 10): within each
/// consumer's list, and everything left for `drain` comes after everything the threads
/// popped (they finished before the drain began).
fn assert_fifo(consumers: &[&Vec<u64>], rest: &[u64]) {
    for p in 1..=2u64 {
        let mine = |list: &[u64]| list.iter().copied().filter(|v| v / 10 == p).collect::<Vec<_>>();
        for got in consumers {
            let seq = mine(got);
            assert!(seq.windows(2).all(|w| w[0] < w[1]), "producer {p} out of order: {got:?}");
        }
        let taken_max = consumers.iter().flat_map(|g| mine(g)).max();
        let left = mine(rest);
        assert!(left.windows(2).all(|w| w[0] < w[1]), "drain out of order: {rest:?}");
        if let (Some(t), Some(l)) = (taken_max, left.first()) {
            assert!(t < *l, "producer {p}: {t} taken while earlier {l} was still queued");
        }
    }
}

/// Two producers and two consumers, capacity 4, started three positions into a lap so the
/// four elements wrap: each delivered exactly once, each producer's elements in order. The
/// consumers take one pop each (two each took 15 min); the drain takes the rest.
#[test]
fn mpmc_two_by_two_exactly_once_per_producer_fifo() {
    builder(2).check(|| {
        let (tx, rx) = mpmc::with_capacity::<u64>(4);
        advance(&tx, &rx, 3);
        // Producer p sends p*10 + 1, p*10 + 2; four cells, so a push is never refused.
        let producers: Vec<_> = (1..=2u64)
            .map(|p| {
                let tx = tx.clone();
                thread::spawn(move || {
                    for v in [p * 10 + 1, p * 10 + 2] {
                        tx.try_push(v).unwrap();
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let rx = rx.clone();
                thread::spawn(move || pop_some(&rx, 1))
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let got: Vec<_> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        let rest = drain(&rx);
        assert_fifo(&got.iter().collect::<Vec<_>>(), &rest);
        let mut all: Vec<_> = got.iter().flatten().chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [11, 12, 21, 22], "lost or duplicated");
    });
}

/// Slices: one producer pushes a run of two, another one element, one consumer pops into a
/// buffer of two while another pops single elements; capacity 4, started three positions
/// into a lap so the run wraps. Every element exactly once, each producer's in order.
#[test]
fn mpmc_slices_exactly_once_per_producer_fifo() {
    builder(2).check(|| {
        let (tx, rx) = mpmc::with_capacity::<u64>(4);
        advance(&tx, &rx, 3);
        let slicer = {
            let tx = tx.clone();
            thread::spawn(move || {
                // Four cells for three elements: a run is never refused, but a racing
                // producer's claim can cut it.
                let values = [11u64, 12];
                let mut done = 0;
                while done < values.len() {
                    let n = tx.try_push_slice(&values[done..]).unwrap();
                    assert!(n > 0, "free cells, yet nothing pushed");
                    done += n;
                }
            })
        };
        let single = thread::spawn(move || tx.try_push(21).unwrap());
        let batcher = {
            let rx = rx.clone();
            thread::spawn(move || {
                let mut buf = [0u64; 2];
                let n = rx.try_pop_into(&mut buf).unwrap();
                buf[..n].to_vec()
            })
        };
        let popper = {
            let rx = rx.clone();
            thread::spawn(move || pop_some(&rx, 1))
        };
        slicer.join().unwrap();
        single.join().unwrap();
        let got = [batcher.join().unwrap(), popper.join().unwrap()];
        let rest = drain(&rx);
        assert_fifo(&got.iter().collect::<Vec<_>>(), &rest);
        let mut all: Vec<_> = got.iter().flatten().chain(&rest).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [11, 12, 21], "lost or duplicated");
    });
}

/// Capacity 2, one element already queued, two producers racing for the last cell while a
/// consumer frees one: a refused push hands its value back, and every accepted element
/// arrives exactly once.
#[test]
fn mpmc_full_ring_capacity_2() {
    builder(3).check(|| {
        let (tx, rx) = mpmc::with_capacity::<u64>(2);
        advance(&tx, &rx, 1);
        tx.try_push(1).unwrap();
        let producers: Vec<_> = [11u64, 21]
            .into_iter()
            .map(|v| {
                let tx = tx.clone();
                thread::spawn(move || match tx.try_push(v) {
                    Ok(()) => Some(v),
                    Err(TryPushError::Full(back)) => {
                        assert_eq!(back, v);
                        None
                    }
                    Err(e) => panic!("{e:?}"),
                })
            })
            .collect();
        let consumer = {
            let rx = rx.clone();
            thread::spawn(move || pop_some(&rx, 1))
        };
        let mut sent: Vec<u64> = producers.into_iter().filter_map(|p| p.join().unwrap()).collect();
        assert!(!sent.is_empty(), "one cell was free, so at least one push succeeds");
        sent.push(1);
        let got = consumer.join().unwrap();
        assert!(got.is_empty() || got == [1], "the oldest element leaves first: {got:?}");
        let mut all: Vec<_> = got.iter().chain(&drain(&rx)).copied().collect();
        all.sort_unstable();
        sent.sort_unstable();
        assert_eq!(all, sent, "lost or duplicated");
    });
}

/// The lease/return protocol of a slot pool: one sender leasing the pool's only slot for
/// two messages, two receivers taking messages and returning the slot, each making a
/// bounded number of attempts (no retry loops, so the model stays finite); the main thread
/// then takes what is left. Every message sent arrives exactly once with the bytes written
/// for it: loom's `UnsafeCell` flags a write by the sender that is not ordered after the
/// previous holder's read (the reuse hand-off through the free ring), and the slot ends
/// free.
#[test]
fn pool_lease_and_return_two_receivers() {
    use gpuring::internal::{HeapPool, heap_pool};
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU64, Ordering};

    // Takes one message if there is one: checks its bytes, records it, returns the slot.
    fn take(
        pool: &HeapPool,
        slot: &UnsafeCell<u64>,
        rx: &mpmc::HeapConsumer<u64>,
        seen: &AtomicU64,
    ) {
        if let Ok(d) = rx.try_pop() {
            let held = pool.receive(d as u32, d >> 32).expect("a sent slot");
            // SAFETY: `receive` made this receiver the slot's only holder.
            let k = slot.with(|p| unsafe { *p });
            // Relaxed: a record of arrivals, read after the threads are joined.
            let before = seen.fetch_or(1 << k, Ordering::Relaxed);
            assert_eq!(before & (1 << k), 0, "message {k} received twice");
            assert!(pool.release(held), "returned once");
        }
    }

    builder(2).check(|| {
        let pool = Arc::new(heap_pool(1));
        let slot = Arc::new(UnsafeCell::new(0u64));
        let (msg_tx, msg_rx) = mpmc::with_capacity::<u64>(2);
        let seen = Arc::new(AtomicU64::new(0)); // bit k: message k arrived
        let sender = {
            let (pool, slot) = (pool.clone(), slot.clone());
            thread::spawn(move || {
                let mut sent = 0u64;
                for k in 1..=2u64 {
                    // The second lease needs the slot back: two attempts, then give up.
                    let Some(lease) = (0..2).find_map(|_| match pool.try_lease() {
                        Ok(Some(l)) => Some(l),
                        Ok(None) => {
                            thread::yield_now(); // every slot in use
                            None
                        }
                        Err(e) => panic!("{e:?}"),
                    }) else {
                        break;
                    };
                    // SAFETY: the lease makes the sender the slot's only user.
                    slot.with_mut(|p| unsafe { *p = k });
                    pool.mark_sent(lease);
                    let d = u64::from(lease.slot) | (u64::from(lease.generation) << 32);
                    msg_tx.try_push(d).expect("room for both messages");
                    sent |= 1 << k;
                }
                sent
            })
        };
        let receivers: Vec<_> = (0..2)
            .map(|_| {
                let (pool, slot, rx, seen) =
                    (pool.clone(), slot.clone(), msg_rx.clone(), seen.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        take(&pool, &slot, &rx, &seen);
                    }
                })
            })
            .collect();
        let sent = sender.join().unwrap();
        for r in receivers {
            r.join().unwrap();
        }
        for _ in 0..2 {
            take(&pool, &slot, &msg_rx, &seen);
        }
        assert!(sent & 0b10 != 0, "the first lease always succeeds");
        assert_eq!(seen.load(Ordering::Relaxed), sent, "exactly the messages sent arrived");
        assert_eq!(pool.free_slots(), 1, "the slot is back");
    });
}

/// Heap MPMC storage whose endpoints each have a claim line and its lock (as named rings
/// give them), and a fixed set of endpoints that are "dead": the repair's view of the
/// participant table.
mod tracked {
    use gpuring::Role;
    use gpuring::internal::{
        ClaimLine, ClaimLock, Claims, Heap, MpmcCell, RingControl, Storage, Watch,
    };
    use loom::sync::Arc;

    /// How many endpoints (claim lines) a model ring has.
    const LINES: usize = 4;

    pub struct Tracked {
        heap: Heap<MpmcCell<u64>>,
        lines: Arc<[Claims; LINES]>,
        locks: Arc<[ClaimLock; LINES]>,
        /// Which line this endpoint writes.
        me: usize,
        /// Bit `i`: the endpoint of line `i` is dead.
        dead: u32,
    }

    impl Tracked {
        pub fn new(capacity: usize, dead: u32) -> Self {
            let heap = Heap::new(capacity, |i| MpmcCell::new(i as u64));
            let lines = Arc::new(std::array::from_fn(|_| Claims::new()));
            let locks = Arc::new(std::array::from_fn(|_| ClaimLock::new()));
            Self { heap, lines, locks, me: 0, dead }
        }

        /// Another endpoint of the same ring, writing line `me` (a clone of the endpoint
        /// of that line if there is one already: the two share its line and lock).
        pub fn endpoint(&self, me: usize) -> Self {
            let (heap, lines, locks) = (self.heap.clone(), self.lines.clone(), self.locks.clone());
            Self { heap, lines, locks, me, dead: self.dead }
        }
    }

    // SAFETY: delegates the memory to `Heap`, which keeps the Storage promises; the claim
    // lines are extra state the ring only writes.
    unsafe impl Storage for Tracked {
        type Cell = MpmcCell<u64>;
        type Watch = Self;
        fn control(&self) -> &RingControl {
            self.heap.control()
        }
        fn cells(&self) -> &[MpmcCell<u64>] {
            self.heap.cells()
        }
        fn watch(&self) -> &Self {
            self
        }
    }

    /// The repair's view of the participant table: a claim line per endpoint, and which of
    /// them are dead.
    impl Watch for Tracked {
        const WATCHES: bool = true;
        fn claims(&self) -> Option<ClaimLine<'_>> {
            Some(ClaimLine { line: &self.lines[self.me], lock: &self.locks[self.me] })
        }
        fn orphaned(&self, role: Role, pos: u64) -> bool {
            let names = |i: usize| {
                let word = match role {
                    Role::Producer => &self.lines[i].push,
                    Role::Consumer => &self.lines[i].pop,
                };
                // Relaxed: as `ParticipantTable::names` (after the caller's Acquire load of
                // the position counter).
                Claims::names(word.load(loom::sync::atomic::Ordering::Relaxed), pos)
            };
            let dead = |i: usize| self.dead & (1 << i) != 0;
            (0..LINES).any(|i| dead(i) && names(i)) && !(0..LINES).any(|i| !dead(i) && names(i))
        }
        fn orphaned_but_mine(&self, pos: u64) -> bool {
            let names = |i: usize| {
                // Relaxed: as `ParticipantTable::names` (after the adopter's fence).
                Claims::names(self.lines[i].pop.load(loom::sync::atomic::Ordering::Relaxed), pos)
            };
            let dead = |i: usize| self.dead & (1 << i) != 0;
            let others = (0..LINES).filter(|&i| i != self.me);
            others.clone().any(|i| dead(i) && names(i))
                && !others.into_iter().any(|i| !dead(i) && names(i))
        }
    }

    /// What an adopter of line `line` leaves when it dies after taking the cell of the
    /// consumer position `pos` (whose winner died): its claim, the adopted stamp, the cell
    /// not freed.
    pub fn die_adopting(storage: &Tracked, line: usize, pos: u64) {
        use gpuring::internal::STAMP_ADOPTED;
        use loom::sync::atomic::Ordering::Relaxed;
        storage.lines[line].pop.store(Claims::word(pos, 1), Relaxed);
        let cell = &storage.cells()[(pos % storage.cells().len() as u64) as usize];
        cell.stamp_word().store((pos + 1) | STAMP_ADOPTED, Relaxed);
    }

    /// What an endpoint of line `line` leaves when it dies right after winning `side`'s
    /// next position: the claim stored, the CAS won, the cell untouched.
    pub fn die_after_claim(storage: &Tracked, line: usize, role: Role) {
        use loom::sync::atomic::Ordering::Relaxed;
        let (counter, word) = match role {
            Role::Producer => (&storage.control().tail, &storage.lines[line].push),
            Role::Consumer => (&storage.control().head, &storage.lines[line].pop),
        };
        let pos = counter.load(Relaxed);
        word.store(Claims::word(pos, 1), Relaxed);
        counter.store(pos + 1, Relaxed);
    }

    /// Stores in line `line` the claim of `role`'s position `pos` (what an endpoint that
    /// tried for `pos` and lost the CAS leaves there).
    pub fn claim(storage: &Tracked, line: usize, role: Role, pos: u64) {
        let word = match role {
            Role::Producer => &storage.lines[line].push,
            Role::Consumer => &storage.lines[line].pop,
        };
        word.store(Claims::word(pos, 1), loom::sync::atomic::Ordering::Relaxed);
    }

    /// A ring of `capacity` whose line 0 is a dead endpoint that named the next `n`
    /// positions of `role`'s side in its line and died before its CAS (or after losing
    /// it): a claim on positions it never won.
    pub fn with_dead_claim(capacity: usize, role: Role, n: u64) -> Tracked {
        use loom::sync::atomic::Ordering::Relaxed;
        let ring = Tracked::new(capacity, 0b001);
        let (counter, word) = match role {
            Role::Producer => (&ring.control().tail, &ring.lines[0].push),
            Role::Consumer => (&ring.control().head, &ring.lines[0].pop),
        };
        word.store(Claims::word(counter.load(Relaxed), n), Relaxed);
        ring
    }
}

/// Pops from `rx` until it has `n` elements, yielding while the ring is empty.
fn pop_n<S: gpuring::internal::Storage<Cell = gpuring::internal::MpmcCell<u64>>>(
    rx: &mpmc::Consumer<u64, S>,
    n: usize,
) -> Vec<u64> {
    let mut got = Vec::new();
    while got.len() < n {
        match rx.try_pop() {
            Ok(v) => got.push(v),
            Err(TryPopError::Empty) => thread::yield_now(),
            Err(e) => panic!("{e:?}"),
        }
    }
    got
}

/// A producer died after naming position 0 in its claim line and before winning it. A live
/// producer then wins position 0 and pushes, while another endpoint runs a repair and then
/// pops: the repair must leave the live producer's cell alone (its own line names it),
/// and the element arrives once; the ring is whole after (a full lap). Fails if a repair
/// acts on a dead claim alone, if the claim is stored after the winning CAS, or if the
/// repair reads `tail` without Acquire (it may then miss the live claim): the skipped
/// cell is freed, the live producer's publish lands on a freed cell, and the element is
/// lost (the consumer waits for good).
#[test]
fn mpmc_a_dead_producers_claim_never_repairs_a_live_producers_cell() {
    builder(3).check(|| {
        let ring = tracked::with_dead_claim(2, gpuring::Role::Producer, 1);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        let producer = thread::spawn(move || {
            tx.try_push(1).unwrap();
            tx
        });
        let fix = ring.endpoint(2);
        let repairer = thread::spawn(move || {
            repair(&fix);
            (pop_n(&rx, 1), rx)
        });
        let tx = producer.join().unwrap();
        let (got, rx) = repairer.join().unwrap();
        assert_eq!(got, [1], "the element, once");
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
        tx.try_push(2).unwrap();
        tx.try_push(3).unwrap();
        assert!(matches!(tx.try_push(4), Err(TryPushError::Full(4))));
        assert_eq!((rx.try_pop(), rx.try_pop()), (Ok(2), Ok(3)));
    });
}

/// Two threads share one producer endpoint (clones: one claim line) and push one element
/// each, while a dead producer's line names positions 0 and 1 (claimed, never won) and
/// another endpoint repairs, then pops (a few tries: two threads spinning at once starve
/// a third in loom's scheduler), and the rest is drained after. The clones take turns
/// with their line, so it names each one's cell until that is written: nothing is
/// skipped, both elements arrive once, and a full lap works after. Fails without the
/// clones' lock (the second clone's claim overwrites the first's, the repair skips the
/// first's cell while it is being written, the consumer frees it, and that element is
/// lost).
#[test]
fn mpmc_clones_sharing_a_claim_line_are_never_repaired() {
    builder(2).check(|| {
        let ring = tracked::with_dead_claim(4, gpuring::Role::Producer, 2);
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        let clones: Vec<_> = (1..=2u64)
            .map(|v| {
                let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
                thread::spawn(move || tx.try_push(v).unwrap())
            })
            .collect();
        let fix = ring.endpoint(2);
        let repairer = thread::spawn(move || {
            repair(&fix);
            let got: Vec<u64> = (0..3).filter_map(|_| rx.try_pop().ok()).collect();
            (got, rx)
        });
        for c in clones {
            c.join().unwrap();
        }
        let (mut got, rx) = repairer.join().unwrap();
        got.extend(std::iter::from_fn(|| rx.try_pop().ok()));
        got.sort_unstable();
        assert_eq!(got, [1, 2], "both elements, once each");
        for v in 10..14 {
            tx.try_push(v).unwrap(); // a full lap: every cell free again
        }
        assert_eq!((0..4).map(|_| rx.try_pop().unwrap()).collect::<Vec<_>>(), [10, 11, 12, 13]);
    });
}

/// A consumer died after naming position 0 in its claim line and before winning it. A live
/// consumer then wins position 0 and pops while another consumer tries to adopt: the
/// element arrives exactly once (the live consumer's line names its cell), and the cell is
/// freed for the next lap. Fails if adoption acts on a dead claim alone or the claim is
/// stored after the winning CAS (both get the element).
#[test]
fn mpmc_a_dead_consumers_claim_never_adopts_a_live_consumers_cell() {
    builder(3).check(|| {
        let ring = tracked::with_dead_claim(2, gpuring::Role::Consumer, 1);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        let adopter = mpmc::Consumer::<u64, _>::new(ring.endpoint(1)).unwrap();
        tx.try_push(1).unwrap();
        let consumer = thread::spawn(move || (rx.try_pop().ok(), rx));
        let adopting = thread::spawn(move || (adopter.try_adopt_then(|v| v), adopter));
        let (popped, rx) = consumer.join().unwrap();
        let (adopted, _adopter) = adopting.join().unwrap();
        let got: Vec<u64> = popped.into_iter().chain(adopted).collect();
        assert_eq!(got, [1], "the element, exactly once");
        tx.try_push(2).unwrap();
        tx.try_push(3).unwrap();
        assert_eq!((rx.try_pop(), rx.try_pop()), (Ok(2), Ok(3)));
    });
}

/// A producer died after winning position 0 (never wrote it). A live producer pushes two
/// elements behind it while a consumer polls and a repairer runs once: the consumer gets
/// exactly the live producer's elements, in order (the dead cell is passed, not returned),
/// and the ring works on the next lap.
#[test]
fn mpmc_dead_producer_claim_is_skipped() {
    use gpuring::Role;
    dead_producer_cell_is_skipped(|ring| tracked::die_after_claim(ring, 0, Role::Producer));
}

/// The model of `mpmc_dead_producer_claim_is_skipped`: `die` leaves line 0's producer dead
/// after winning position 0 of a ring of 4; a live producer pushes two elements behind it
/// while a consumer polls and a repairer runs once.
fn dead_producer_cell_is_skipped(die: impl Fn(&tracked::Tracked) + Sync + Send + 'static) {
    use tracked::Tracked;
    builder(2).check(move || {
        let ring = Tracked::new(4, 0b001);
        die(&ring);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        let producer = thread::spawn(move || {
            tx.try_push(7).unwrap();
            tx.try_push(8).unwrap();
            tx
        });
        let repairer = {
            let ring = ring.endpoint(2);
            thread::spawn(move || repair(&ring) > 0)
        };
        let consumer = thread::spawn(move || {
            let mut got = Vec::new();
            while got.len() < 2 {
                match rx.try_pop() {
                    Ok(v) => got.push(v),
                    Err(TryPopError::Empty) => thread::yield_now(),
                    Err(e) => panic!("{e:?}"),
                }
            }
            (got, rx)
        });
        let tx = producer.join().unwrap();
        assert!(repairer.join().unwrap(), "the dead producer's cell was stalled");
        let (got, rx) = consumer.join().unwrap();
        assert_eq!(got, [7, 8], "the live producer's elements, once, in order");
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
        for v in 10..14 {
            tx.try_push(v).unwrap(); // a full lap: every cell free again
        }
        assert!(matches!(tx.try_push(99), Err(TryPushError::Full(99))));
        assert_eq!((0..4).map(|_| rx.try_pop().unwrap()).collect::<Vec<_>>(), [10, 11, 12, 13]);
    });
}

/// A live producer's line still names a position it tried for and lost, to a producer that
/// then died holding it unwritten, and the ring is full behind the dead cell. While the
/// live line names it, no repair touches the cell; once the live producer finds nothing to
/// claim (the ring full), its word is cleared, the next repair skips the dead cell, and the
/// consumer gets the live element and passes the dead one. Fails without the clearing (the
/// ring stalls for good: the live producer waits for room behind that very cell).
#[test]
fn mpmc_a_lost_claim_does_not_stall_a_dead_winners_cell() {
    use gpuring::Role;
    use tracked::{Tracked, claim, die_after_claim};
    builder(2).check(|| {
        let ring = Tracked::new(2, 0b001);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        tx.try_push(7).unwrap();
        die_after_claim(&ring, 0, Role::Producer); // won position 1, never wrote it
        claim(&ring, 1, Role::Producer, 1); // the live producer lost position 1 to it
        assert_eq!(repair(&ring.endpoint(2)), 0, "a live line names the cell");
        assert!(matches!(tx.try_push(8), Err(TryPushError::Full(8))));
        assert_eq!(repair(&ring.endpoint(2)), 1, "the dead winner's cell, skipped");
        assert_eq!(rx.try_pop(), Ok(7));
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty), "the skipped cell passed");
        tx.try_push(8).unwrap();
        tx.try_push(9).unwrap();
        assert_eq!((rx.try_pop(), rx.try_pop()), (Ok(8), Ok(9)));
    });
}

/// A thread that pushes `item` with `tx` as soon as there is room (yielding while the ring
/// is full), then hands `tx` back.
fn push_when_room(
    tx: mpmc::Producer<u64, tracked::Tracked>,
    mut item: u64,
) -> thread::JoinHandle<mpmc::Producer<u64, tracked::Tracked>> {
    thread::spawn(move || {
        loop {
            match tx.try_push(item) {
                Ok(()) => return tx,
                Err(TryPushError::Full(back)) => {
                    item = back;
                    thread::yield_now();
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    })
}

/// A consumer died after winning position 0 of a full ring of 2 (never freed the cell).
/// A live producer waits for room while a live consumer pops and, finding the ring empty,
/// adopts the dead consumer's element: the consumer gets element 2, then element 1 (which
/// the dead one never returned), the producer's push lands in the freed cell, and nothing
/// is lost or duplicated.
#[test]
fn mpmc_dead_consumers_element_is_adopted() {
    use gpuring::Role;
    use tracked::{Tracked, die_after_claim};
    builder(2).check(|| {
        let ring = Tracked::new(2, 0b001);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        tx.try_push(1).unwrap();
        tx.try_push(2).unwrap();
        die_after_claim(&ring, 0, Role::Consumer);
        let producer = push_when_room(tx, 3);
        let consumer = thread::spawn(move || {
            let mut got = Vec::new();
            while got.len() < 2 {
                match rx.try_pop() {
                    Ok(v) => got.push(v),
                    Err(TryPopError::Empty) => match rx.try_adopt_then(|v| v) {
                        Some(v) => got.push(v),
                        None => thread::yield_now(),
                    },
                    Err(e) => panic!("{e:?}"),
                }
            }
            (got, rx)
        });
        let _tx = producer.join().unwrap();
        let (got, rx) = consumer.join().unwrap();
        assert_eq!(got, [2, 1], "the live element, then the dead consumer's, once each");
        assert_eq!(rx.try_pop(), Ok(3));
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    });
}

/// A consumer died after winning position 0 (never freed the cell). Two live consumers
/// try to adopt it at once: exactly one gets the element, and the cell is freed (a full
/// lap fits after). Fails if an adopter does not name the cell in its line before looking
/// (the second takes the first's adopted cell too: the element twice).
#[test]
fn mpmc_two_adopters_take_a_dead_consumers_element_once() {
    two_adopters(false);
}

/// As `mpmc_two_adopters_take_a_dead_consumers_element_once`, where the consumer that
/// adopted the cell first died too: two live consumers adopt it again at once. Fails
/// without the fence between an adopter's claim and its look (the stamp no longer
/// changes, so each may miss the other's claim and both take the element).
#[test]
fn mpmc_two_adopters_take_a_dead_adopters_element_once() {
    two_adopters(true);
}

/// The model of the two tests above: line 0 won position 0 and died (and, with
/// `dead_adopter`, line 1 adopted it and died); lines 2 and 3 adopt at once.
fn two_adopters(dead_adopter: bool) {
    use gpuring::Role;
    use tracked::{Tracked, die_adopting, die_after_claim};
    builder(3).check(move || {
        let ring = Tracked::new(2, 0b0011);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(1)).unwrap();
        tx.try_push(1).unwrap();
        die_after_claim(&ring, 0, Role::Consumer);
        if dead_adopter {
            die_adopting(&ring, 1, 0);
        }
        let adopters: Vec<_> = [2, 3]
            .map(|line| {
                let adopter = mpmc::Consumer::<u64, _>::new(ring.endpoint(line)).unwrap();
                thread::spawn(move || adopter.try_adopt_then(|v| v))
            })
            .into_iter()
            .collect();
        let got: Vec<u64> = adopters.into_iter().filter_map(|a| a.join().unwrap()).collect();
        assert!(got.len() <= 1, "the element once at most: {got:?}");
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(2)).unwrap();
        let got: Vec<u64> = got.into_iter().chain(rx.try_adopt_then(|v| v)).collect();
        assert_eq!(got, [1], "the element, exactly once");
        tx.try_push(2).unwrap();
        tx.try_push(3).unwrap();
        assert_eq!((rx.try_pop(), rx.try_pop()), (Ok(2), Ok(3)));
    });
}

/// A consumer died after winning position 0 of a full ring of 2, and the consumer that
/// adopted its cell died too, before freeing it. A live consumer adopts the cell again
/// while a producer waits for room: the consumer gets element 1 once (and element 2), the
/// producer's push lands in the freed cell. Fails if an adopted cell is never adopted
/// again (the ring stalls there for good, its element never delivered: what the MPMC
/// kill storms hit).
#[test]
fn mpmc_a_dead_adopters_cell_is_adopted_again() {
    use gpuring::Role;
    use tracked::{Tracked, die_adopting, die_after_claim};
    builder(2).check(|| {
        let ring = Tracked::new(2, 0b0011);
        let tx = mpmc::Producer::<u64, _>::new(ring.endpoint(2)).unwrap();
        tx.try_push(1).unwrap();
        tx.try_push(2).unwrap();
        die_after_claim(&ring, 0, Role::Consumer);
        die_adopting(&ring, 1, 0);
        let rx = mpmc::Consumer::<u64, _>::new(ring.endpoint(3)).unwrap();
        let producer = push_when_room(tx, 3);
        let adopted = rx.try_adopt_then(|v| v);
        assert_eq!(adopted, Some(1), "the dead adopter's cell, adopted again");
        assert_eq!(rx.try_pop(), Ok(2));
        let _tx = producer.join().unwrap();
        assert_eq!(rx.try_pop(), Ok(3));
        assert_eq!(rx.try_adopt_then(|v| v), None, "nothing twice");
        assert_eq!(rx.try_pop(), Err(TryPopError::Empty));
    });
}

/// Heap storage (SPSC or MPMC cells) with a producer attach count, as rings in shared
/// memory have one: the departure hint that consumers read.
mod departing {
    use gpuring::Role;
    use gpuring::internal::{Gone, Heap, RingControl, Storage, Watch};
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU32, Ordering};

    pub struct Departing<C> {
        heap: Heap<C>,
        producers: Arc<AtomicU32>,
    }

    impl<C> Departing<C> {
        /// A ring of `capacity` cells made by `cell`, with one producer attached.
        pub fn new(capacity: usize, cell: impl FnMut(usize) -> C) -> Self {
            Self { heap: Heap::new(capacity, cell), producers: Arc::new(AtomicU32::new(1)) }
        }

        pub fn handle(&self) -> Self {
            Self { heap: self.heap.clone(), producers: self.producers.clone() }
        }

        /// What a producer's clean detach does to the count (`Attachment`'s drop).
        pub fn leave(&self) {
            // Release: as in `Attachment::drop`, pairs with the Acquire in `maybe_left`.
            self.producers.fetch_sub(1, Ordering::Release);
        }
    }

    // SAFETY: delegates the memory to `Heap`, which keeps the Storage promises; the count
    // is extra state the ring only reads.
    unsafe impl<C> Storage for Departing<C> {
        type Cell = C;
        type Watch = Self;
        fn control(&self) -> &RingControl {
            self.heap.control()
        }
        fn cells(&self) -> &[C] {
            self.heap.cells()
        }
        fn watch(&self) -> &Self {
            self
        }
    }

    /// The count alone stands for the locks: 0 producers means they have left.
    impl<C> Watch for Departing<C> {
        const WATCHES: bool = true;
        fn maybe_left(&self, role: Role) -> bool {
            // Acquire: pairs with the Release in `leave`.
            role == Role::Producer && self.producers.load(Ordering::Acquire) == 0
        }
        fn gone(&self, role: Role) -> Option<Gone> {
            self.maybe_left(role).then_some(Gone::Left)
        }
    }
}

/// What `try_pop` returns until it says `Disconnected` (yielding while it finds nothing).
fn until_disconnected(mut try_pop: impl FnMut() -> Result<u64, TryPopError>) -> Vec<u64> {
    let mut got = Vec::new();
    loop {
        match try_pop() {
            Ok(v) => got.push(v),
            Err(TryPopError::Empty) => thread::yield_now(),
            Err(TryPopError::Disconnected) => return got,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A producer pushes one element and leaves (its count drops, Release) while a consumer
/// polls: `Disconnected` comes only after the element, never instead of it. The consumer
/// reads the count after finding the ring empty; a count of 0 must make the element
/// visible to its second look (SPSC: `tail`).
#[test]
fn spsc_disconnected_only_after_what_was_pushed() {
    use departing::Departing;
    use gpuring::internal::SpscCell;
    builder(3).check(|| {
        let ring = Departing::new(2, |_| SpscCell::<u64>::new());
        // SAFETY: one producer and one consumer of this ring.
        let mut tx = unsafe { spsc::Producer::<u64, _>::new(ring.handle()) }.unwrap();
        // SAFETY: as above.
        let mut rx = unsafe { spsc::Consumer::<u64, _>::new(ring.handle()) }.unwrap();
        let producer = thread::spawn(move || {
            tx.try_push(7).unwrap();
            ring.leave();
        });
        let got = until_disconnected(|| rx.try_pop());
        producer.join().unwrap();
        assert_eq!(got, [7], "everything pushed arrives before Disconnected");
    });
}

/// The same with MPMC cells (stamps): the consumer's second look reads the cell's stamp.
#[test]
fn mpmc_disconnected_only_after_what_was_pushed() {
    use departing::Departing;
    use gpuring::internal::MpmcCell;
    builder(2).check(|| {
        let ring = Departing::new(2, |i| MpmcCell::<u64>::new(i as u64));
        let tx = mpmc::Producer::<u64, _>::new(ring.handle()).unwrap();
        let rx = mpmc::Consumer::<u64, _>::new(ring.handle()).unwrap();
        let producer = thread::spawn(move || {
            tx.try_push(7).unwrap();
            ring.leave();
        });
        let got = until_disconnected(|| rx.try_pop());
        producer.join().unwrap();
        assert_eq!(got, [7], "everything pushed arrives before Disconnected");
    });
}

/// A pool's free ring on the heap whose endpoints each have an identity, and a fixed set of
/// identities that are "gone": the pool protocol's view of its participant table, for the
/// models of redelivery (`PoolCore::adopt`).
mod parties {
    use gpuring::internal::{Heap, MpmcCell, PoolCore, RingControl, SlotRecord, Storage, Watch};
    use std::sync::Arc;

    #[derive(Clone)]
    pub struct Party {
        heap: Heap<MpmcCell<u32>>,
        me: u32,
        /// Bit `i`: the endpoint of identity `i` is gone.
        gone: u32,
    }

    // SAFETY: delegates the memory to `Heap`, which keeps the Storage promises.
    unsafe impl Storage for Party {
        type Cell = MpmcCell<u32>;
        type Watch = Self;
        fn control(&self) -> &RingControl {
            self.heap.control()
        }
        fn cells(&self) -> &[MpmcCell<u32>] {
            self.heap.cells()
        }
        fn watch(&self) -> &Self {
            self
        }
    }

    impl Watch for Party {
        const WATCHES: bool = false;
        fn id(&self) -> Option<u32> {
            Some(self.me)
        }
        fn id_gone(&self, id: u32) -> Option<Option<u32>> {
            (self.gone & (1 << id) != 0).then_some(None)
        }
    }

    pub type PartyPool = PoolCore<Arc<[SlotRecord]>, Party>;

    /// A pool of one slot, free, and its view as the endpoint of each identity in `ids`
    /// (the endpoints of identities in `gone` count as gone).
    pub fn pool(ids: &[u32], gone: u32) -> Vec<PartyPool> {
        let heap =
            Heap::new(
                2,
                |i| {
                    if i == 0 { MpmcCell::written(0, 0) } else { MpmcCell::new(i as u64) }
                },
            );
        // Relaxed: nobody else holds the storage yet.
        heap.control().tail.store(1, loom::sync::atomic::Ordering::Relaxed);
        let records: Arc<[SlotRecord]> = Arc::from(vec![SlotRecord::new()].into_boxed_slice());
        ids.iter()
            .map(|&me| {
                let party = Party { heap: heap.clone(), me, gone };
                PoolCore::new(records.clone(), party).expect("a fresh ring")
            })
            .collect()
    }
}

/// Redelivery: a sender writes a slot and its sent copy and publishes the message, and a
/// receiver (identity 2, which the others see as gone) takes the slot and dies holding it
/// (one thread: the hand-off through the descriptor ring is the rings' models' business);
/// two live receivers each look once for such messages meanwhile (`adopt`). At most one of
/// them takes it over, and whoever does reads what the sender wrote, bytes and copy: loom
/// fails the model if the take is not ordered after those writes (the dead receiver's
/// Release take of the slot, the adopter's Acquire; with a Relaxed take it fails). If
/// neither found it (they looked before the receiver took it), a later look does. Its
/// return frees the slot, and nothing is left to take over.
#[test]
fn redelivery_takes_a_dead_receivers_message_over_once() {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    builder(3).check(|| {
        let mut pools = parties::pool(&[1, 2, 3, 4], 1 << 2).into_iter();
        let (sender, dead) = (pools.next().unwrap(), pools.next().unwrap());
        // The slot's bytes and its sent copy.
        let bytes = Arc::new((UnsafeCell::new(0u64), UnsafeCell::new(0u64)));
        let writer = {
            let bytes = bytes.clone();
            thread::spawn(move || {
                let lease = sender.try_lease().unwrap().expect("the slot is free");
                // SAFETY: the lease makes the sender the slot's only user.
                bytes.0.with_mut(|p| unsafe { *p = 7 });
                // SAFETY: as above: the copy is the sender's until the slot is sent.
                bytes.1.with_mut(|p| unsafe { *p = u64::from(lease.generation) });
                sender.mark_sent(lease);
                dead.receive(0, u64::from(lease.generation)).expect("a sent slot");
                // ... and the receiver dies holding it: never released.
            })
        };
        let read = |held: gpuring::internal::SlotRef| {
            // SAFETY: `adopt` made this receiver the slot's only holder.
            let got = (bytes.0.with(|p| unsafe { *p }), bytes.1.with(|p| unsafe { *p }));
            assert_eq!(got, (7, u64::from(held.generation)), "what the sender wrote");
        };
        let adopters: Vec<_> = pools
            .map(|pool| {
                let bytes = bytes.clone();
                thread::spawn(move || {
                    let held = pool.adopt(|_| true, |_, _| false, |_| 0);
                    if let Some(held) = held {
                        // SAFETY: as in `read`.
                        let got =
                            (bytes.0.with(|p| unsafe { *p }), bytes.1.with(|p| unsafe { *p }));
                        assert_eq!(got, (7, u64::from(held.generation)), "what the sender wrote");
                    }
                    (pool, held)
                })
            })
            .collect();
        writer.join().unwrap();
        let looked: Vec<_> = adopters.into_iter().map(|a| a.join().unwrap()).collect();
        let (who, held) = match took_once(&looked) {
            Some(took) => took,
            None => {
                let held = looked[0].0.adopt(|_| true, |_, _| false, |_| 0);
                let held = held.expect("the dead receiver's message is still there");
                read(held);
                (0, held)
            }
        };
        assert!(looked[who].0.release(held), "returned once");
        assert_eq!(looked[who].0.free_slots(), 1, "the slot is free again");
        assert!(looked[1 - who].0.adopt(|_| true, |_, _| false, |_| 0).is_none(), "nothing left");
    });
}

/// Of two receivers' looks for a message to take over, the one that took it (at most one
/// may: asserted) and what it took; `None` if neither did.
fn took_once(
    looked: &[(parties::PartyPool, Option<gpuring::internal::SlotRef>)],
) -> Option<(usize, gpuring::internal::SlotRef)> {
    let taken: Vec<usize> = (0..looked.len()).filter(|&i| looked[i].1.is_some()).collect();
    assert!(taken.len() <= 1, "taken over once");
    taken.first().map(|&i| (i, looked[i].1.unwrap()))
}

/// A live receiver (identity 2) takes a message and gives it back (`give_up`, what
/// `Receiver::requeue` does: HELD by party 0, which names nobody and so is gone) while two
/// other receivers (identities 3 and 4) look for messages to take over: at most one takes
/// it, reading what the sender wrote; if neither found it, a later look does. The one that
/// gave it back cannot return it too, and its taker's return frees the slot once.
#[test]
fn a_message_given_back_is_taken_over_once() {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    builder(3).check(|| {
        let mut pools = parties::pool(&[1, 2, 3, 4], 1 << 0).into_iter();
        let (sender, giver) = (pools.next().unwrap(), pools.next().unwrap());
        let bytes = Arc::new(UnsafeCell::new(0u64));
        let writer = {
            let bytes = bytes.clone();
            thread::spawn(move || {
                let lease = sender.try_lease().unwrap().expect("the slot is free");
                // SAFETY: the lease makes the sender the slot's only user.
                bytes.with_mut(|p| unsafe { *p = 7 });
                sender.mark_sent(lease);
                let held = giver.receive(0, u64::from(lease.generation)).expect("a sent slot");
                assert!(giver.give_up(held), "held by the giver");
                assert!(!giver.release(held), "given back: no longer the giver's to return");
                (sender, held)
            })
        };
        let takers: Vec<_> = pools
            .map(|pool| {
                let bytes = bytes.clone();
                thread::spawn(move || {
                    let held = pool.adopt(|_| true, |_, _| false, |_| 0);
                    if held.is_some() {
                        // SAFETY: `adopt` made this receiver the slot's only holder.
                        assert_eq!(bytes.with(|p| unsafe { *p }), 7, "what the sender wrote");
                    }
                    (pool, held)
                })
            })
            .collect();
        let (sender, given) = writer.join().unwrap();
        let looked: Vec<_> = takers.into_iter().map(|t| t.join().unwrap()).collect();
        let (who, held) = match took_once(&looked) {
            Some(took) => took,
            None => {
                let held = looked[0].0.adopt(|_| true, |_, _| false, |_| 0);
                (0, held.expect("the message given back is still there"))
            }
        };
        assert_eq!(held, given, "the same slot and generation");
        assert!(looked[who].0.release(held), "returned once");
        assert_eq!(sender.free_slots(), 1, "the slot is free again");
        assert!(looked[1 - who].0.adopt(|_| true, |_, _| false, |_| 0).is_none(), "nothing left");
    });
}

/// A receiver (identity 2, gone) took a slot and died before its descriptor left the ring;
/// a live receiver pops that descriptor and takes the slot over (`receive`), then moves the
/// ring on, while another looks for messages to deliver again (`adopt`, which checks that
/// the descriptor is no longer queued after reading the slot's word). The message goes to
/// the live receiver through the ring, and is never also taken over.
#[test]
fn redelivery_never_takes_a_message_still_queued() {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    builder(3).check(|| {
        let mut pools = parties::pool(&[1, 2, 3, 4], 1 << 2).into_iter();
        let (sender, dead, live, adopter) = (
            pools.next().unwrap(),
            pools.next().unwrap(),
            pools.next().unwrap(),
            pools.next().unwrap(),
        );
        let lease = sender.try_lease().unwrap().unwrap();
        sender.mark_sent(lease);
        dead.receive(0, u64::from(lease.generation)).unwrap();
        // Its descriptor is still in the ring: the dead receiver never moved `head`.
        let queued = Arc::new(AtomicBool::new(true));
        let popper = {
            let queued = queued.clone();
            thread::spawn(move || {
                let held = live.receive(0, u64::from(lease.generation));
                // Release: pairs with the adopter's Acquire (the ring's `head`).
                queued.store(false, Ordering::Release);
                (live, held)
            })
        };
        let looker = thread::spawn(move || {
            // Acquire: as above.
            adopter.adopt(|_| true, |_, _| queued.load(Ordering::Acquire), |_| 0)
        });
        let (live, held) = popper.join().unwrap();
        assert!(looker.join().unwrap().is_none(), "a queued message is never taken over");
        let held = held.expect("the live receiver takes the dead one's slot over");
        assert!(live.release(held));
    });
}

/// Broadcast (issue 38, the ring alone): a reader joins while the producer tries to push
/// 0, 1, 2 into a ring of 2 (once each, stopping at the first refusal), and reads a few
/// times; what is left is read after. What it read is a run of consecutive values ending at
/// the last one pushed (it starts with whatever came after it joined, and nothing it reads
/// was overwritten). Fails if the join keeps its first `tail` guess, or if either SeqCst
/// fence goes (the producer, its minimum computed without the new cursor, overwrites a cell
/// the reader has not read).
#[test]
fn broadcast_a_joining_reader_never_reads_an_overwritten_cell() {
    use gpuring::internal::broadcast;
    builder(3).check(|| {
        let mut tx = broadcast::with_capacity::<u64>(2, 2);
        let subscriber = tx.subscriber();
        let producer = thread::spawn(move || {
            let pushed = (0..3u64).take_while(|&v| tx.try_push(v).is_ok()).last();
            (tx, pushed)
        });
        let reader = thread::spawn(move || {
            let mut r = subscriber.subscribe().unwrap();
            let got: Vec<u64> = (0..3).filter_map(|_| r.try_read().ok()).collect();
            (r, got)
        });
        let (_tx, pushed) = producer.join().unwrap();
        let (mut r, mut got) = reader.join().unwrap();
        got.extend(std::iter::from_fn(|| r.try_read().ok()));
        assert!(got.windows(2).all(|w| w[1] == w[0] + 1), "a gap or a rewind: {got:?}");
        if let Some(last) = got.last() {
            assert_eq!(Some(*last), pushed, "the run ends at the last element pushed");
        }
    });
}

/// A broadcast channel's slot protocol (`pool::lease::shared`) over a heap broadcast ring
/// and a heap pool of one slot: the sender sends message 1 in the slot, then tries (its
/// scan at an empty pool, three times, yielding between) to take the slot back and write
/// message 2 in it, while two readers each read the message in place and drop it, the last
/// one putting the slot back. With `late`, the second reader joins while the message is
/// being sent (it reads it or not, as the join decides). The slot's bytes are a loom cell:
/// a write while a reader still reads it is a data race loom reports. Fails if the reclaim
/// ignores the holders (checked at this preemption bound, 2; at 1 the model passes even
/// then).
fn broadcast_slot(late: bool) {
    use gpuring::internal::{broadcast, heap_pool};
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, Ordering};
    builder(2).check(move || {
        let pool = Arc::new(heap_pool(1));
        let bytes = Arc::new(UnsafeCell::new(0u64));
        let mut tx = broadcast::with_capacity::<u64>(2, 2);
        let first = tx.subscribe().unwrap();
        let second = if late { None } else { Some(tx.subscribe().unwrap()) };
        let subscriber = tx.subscriber();
        let sent = Arc::new(AtomicBool::new(false));
        let spawn_reader = |r: Option<broadcast::Reader<u64, _>>| {
            let (pool, bytes, subscriber) = (pool.clone(), bytes.clone(), subscriber.clone());
            let sent = sent.clone();
            thread::spawn(move || {
                let mut r = r.unwrap_or_else(|| subscriber.subscribe().unwrap());
                let bit = 1u64 << r.index();
                let held = loop {
                    // SeqCst (model): whether the push has happened.
                    let was_sent = sent.load(Ordering::SeqCst);
                    match r.try_read_then(|_, d| pool.hold_shared(d as u32, d >> 32, bit)) {
                        Ok(held) => break held.expect("a valid hold"),
                        // Joined after the send: nothing to read.
                        Err(_) if was_sent => return None,
                        Err(_) => thread::yield_now(),
                    }
                };
                // SAFETY: (model) a read of the slot under the reader's hold.
                let v = bytes.with(|p| unsafe { *p });
                let cursors = r.cursors().clone();
                pool.release_shared_then_reclaim(held, bit, || broadcast::slowest_now(&cursors));
                Some(v)
            })
        };
        // The late reader's thread starts before the send, to race it.
        let b = if late { Some(spawn_reader(None)) } else { None };
        let lease = pool.try_lease().unwrap().unwrap();
        // SAFETY: (model) the sender's write of its leased slot.
        bytes.with_mut(|p| unsafe { *p = 1 });
        pool.set_sent_at(lease, tx.next_position());
        pool.mark_sent(lease);
        tx.try_push(u64::from(lease.slot) | u64::from(lease.generation) << 32).unwrap();
        // SeqCst (model): after the push.
        sent.store(true, Ordering::SeqCst);
        let a = spawn_reader(Some(first));
        let b = b.unwrap_or_else(|| spawn_reader(second));
        // The sender's reuse: the slot once free again (its scan, or a reader's return).
        for _ in 0..3 {
            pool.reclaim_all_sent(tx.slowest());
            if pool.try_lease().unwrap().is_some() {
                // SAFETY: (model) the write of message 2, which no reader may see or race.
                bytes.with_mut(|p| unsafe { *p = 2 });
                break;
            }
            thread::yield_now();
        }
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(a, Some(1), "a reader there before the send reads message 1");
        assert!(b.is_none_or(|v| v == 1), "message 1 or nothing: {b:?}");
    });
}

#[test]
fn broadcast_slot_goes_back_only_after_every_holder() {
    broadcast_slot(false);
}

#[test]
fn broadcast_slot_with_a_reader_joining_during_the_send() {
    broadcast_slot(true);
}

/// A lagging broadcast channel's retirement (`pool::lease::shared`): a heap pool of one
/// slot; the sender sends message 1 in it (the descriptor handed over by an atomic, as the
/// ring's Release publish would), then, twice, yielding between, tries to retire the slot
/// (`retire_oldest`) and write message 2 in it, while a reader takes its hold
/// (`hold_retirable`), reads the slot in place and drops its hold. The slot's bytes are a
/// loom cell: a write while the reader reads is a data race loom reports. The reader
/// reads message 1 or is told it missed it, never message 2. Fails without either side's
/// SeqCst fence (checked: the sender's, the reader's).
#[test]
fn a_retired_slot_is_never_rewritten_under_a_reader() {
    use gpuring::internal::heap_pool;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU64, Ordering};
    builder(2).check(|| {
        let pool = Arc::new(heap_pool(1));
        let bytes = Arc::new(UnsafeCell::new(0u64));
        let published = Arc::new(AtomicU64::new(0));
        let reader = {
            let (pool, bytes, published) = (pool.clone(), bytes.clone(), published.clone());
            thread::spawn(move || {
                let d = loop {
                    // Acquire (model): the ring's read of the descriptor.
                    match published.load(Ordering::Acquire) {
                        0 => thread::yield_now(),
                        d => break d,
                    }
                };
                let held =
                    pool.hold_retirable(d as u32, d >> 32, 1).expect("a valid descriptor")?;
                // SAFETY: (model) a read of the slot under the reader's hold.
                let v = bytes.with(|p| unsafe { *p });
                pool.release_shared(held, 1);
                Some(v)
            })
        };
        let lease = pool.try_lease().unwrap().unwrap();
        // SAFETY: (model) the sender's write of its leased slot.
        bytes.with_mut(|p| unsafe { *p = 1 });
        pool.set_sent_at(lease, 0);
        pool.mark_sent(lease);
        // Release (model): the ring's publish.
        published
            .store(u64::from(lease.slot) | u64::from(lease.generation) << 32, Ordering::Release);
        for _ in 0..2 {
            if pool.retire_oldest(1) {
                let again = pool.try_lease().unwrap().expect("the retired slot, free");
                assert_eq!(again.slot, lease.slot);
                // SAFETY: (model) the write of message 2, which the reader may not race.
                bytes.with_mut(|p| unsafe { *p = 2 });
                break;
            }
            thread::yield_now();
        }
        let got = reader.join().unwrap();
        assert!(got.is_none_or(|v| v == 1), "message 1 or told it was missed: {got:?}");
    });
}
