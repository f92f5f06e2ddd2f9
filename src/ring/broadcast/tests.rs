//! The broadcast ring over heap storage: order, back-pressure, joins, forged cursors,
//! the lagging policy, and threads.

use super::{TryPushError, TryReadError, with_capacity, with_policy};

#[test]
fn every_reader_gets_every_element_in_order_and_the_slowest_holds_the_producer() {
    let mut tx = with_capacity::<u64>(4, 3);
    let mut a = tx.subscribe().unwrap();
    let mut b = tx.subscribe().unwrap();
    for v in 0..4 {
        tx.try_push(v).unwrap();
    }
    assert!(matches!(tx.try_push(4), Err(TryPushError::Full(4))), "a ring ahead of the slowest");
    assert_eq!((0..4).map(|_| a.try_read().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(matches!(tx.try_push(4), Err(TryPushError::Full(4))), "b has read nothing yet");
    assert_eq!(b.try_read().unwrap(), 0);
    tx.try_push(4).unwrap();
    assert_eq!(a.try_read().unwrap(), 4);
    assert!(matches!(a.try_read(), Err(TryReadError::Empty)));
    assert_eq!((0..4).map(|_| b.try_read().unwrap()).collect::<Vec<_>>(), [1, 2, 3, 4]);
    drop(b);
    for v in 5..9 {
        tx.try_push(v).unwrap(); // b's cursor gone: only a counts
    }
    assert_eq!(tx.readers(), 1);
}

#[test]
fn a_reader_that_joins_later_starts_with_the_next_element() {
    let mut tx = with_capacity::<u64>(2, 1);
    tx.try_push(1).unwrap();
    let mut r = tx.subscribe().unwrap();
    assert!(tx.subscribe().is_none(), "one place");
    assert!(matches!(r.try_read(), Err(TryReadError::Empty)));
    tx.try_push(2).unwrap();
    assert_eq!(r.try_read().unwrap(), 2);
    drop(r);
    assert!(tx.subscribe().is_some(), "its place free again");
}

#[test]
fn a_forged_cursor_ahead_of_tail_holds_nothing_back() {
    use super::Cursors;
    let mut tx = with_capacity::<u64>(2, 2);
    let r = tx.subscribe().unwrap();
    r.storage.cursor(r.index).store(1000, crate::sync::Ordering::Relaxed);
    for v in 0..5 {
        tx.try_push(v).unwrap();
    }
}

#[test]
fn a_reader_overrun_says_corrupted_and_reads_nothing() {
    use super::Cursors;
    let mut tx = with_capacity::<u64>(2, 1);
    let mut r = tx.subscribe().unwrap();
    // A producer that ignored the reader (a forged mask): three ahead of a ring of two.
    r.storage.readers().store(0, crate::sync::Ordering::Relaxed);
    for v in 0..3 {
        tx.try_push(v).unwrap();
    }
    assert!(matches!(r.try_read(), Err(TryReadError::Corrupted(_))));
}

#[test]
fn a_lagging_producer_never_waits_and_a_reader_behind_is_told_what_it_missed() {
    let mut tx = with_policy::<u64>(4, 2, true);
    let (mut slow, mut fast) = (tx.subscribe().unwrap(), tx.subscribe().unwrap());
    for v in 0..10 {
        tx.try_push(v).unwrap(); // never full
        assert_eq!(fast.try_read().unwrap(), v, "a reader that keeps up misses nothing");
    }
    // `slow` read nothing: 0..6 were overwritten; 6..10 are still there.
    assert!(matches!(slow.try_read(), Err(TryReadError::Lagged(6))));
    assert_eq!((0..4).map(|_| slow.try_read().unwrap()).collect::<Vec<_>>(), [6, 7, 8, 9]);
    assert!(matches!(slow.try_read(), Err(TryReadError::Empty)));
}

#[test]
fn a_lagging_reader_drops_a_copy_whose_cell_is_being_rewritten() {
    let mut tx = with_policy::<u64>(2, 1, true);
    let mut r = tx.subscribe().unwrap();
    tx.try_push(0).unwrap();
    tx.try_push(1).unwrap();
    // The producer has begun writing position 2 (over position 0's cell), as it would
    // mid-push: `head` says so before the cell changes.
    use super::Storage;
    r.storage.control().head.store(3, crate::sync::Ordering::Relaxed);
    assert!(matches!(r.try_read(), Err(TryReadError::Lagged(1))), "0 may be torn: dropped");
    assert_eq!(r.try_read().unwrap(), 1);
}

#[test]
fn threads_read_every_element_exactly_once_in_order() {
    let mut tx = with_capacity::<u64>(8, 4);
    let n = if cfg!(miri) { 50 } else { 20_000 };
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let mut r = tx.subscribe().unwrap();
            std::thread::spawn(move || {
                let mut next = 0;
                while next < n {
                    match r.try_read() {
                        Ok(v) => {
                            assert_eq!(v, next, "in order, none missed, none twice");
                            next += 1;
                        }
                        Err(_) => std::thread::yield_now(),
                    }
                }
            })
        })
        .collect();
    for v in 0..n {
        while tx.try_push(v).is_err() {
            std::thread::yield_now();
        }
    }
    readers.into_iter().for_each(|t| t.join().unwrap());
}

#[test]
fn bits_names_each_place_set_lowest_first() {
    assert_eq!(super::bits(0).count(), 0);
    assert_eq!(super::bits(0b1010_0001).collect::<Vec<_>>(), [0, 5, 7]);
    assert_eq!(super::bits(1 << 63).collect::<Vec<_>>(), [63]);
    assert_eq!(super::bits(u64::MAX).collect::<Vec<_>>(), (0..64).collect::<Vec<_>>());
}
