//! The layouts' unit tests: sizes, offsets, and the words they encode.

use super::*;
use crate::sync::AtomicU64;

#[test]
fn kind_round_trip() {
    for k in SegmentKind::ALL {
        assert_eq!(SegmentKind::from_raw(k as u32), Some(k));
    }
    assert_eq!(SegmentKind::from_raw(0), None);
    assert_eq!(SegmentKind::from_raw(77), None);
}

#[test]
fn bytes_round_trip_through_words() {
    let words: [AtomicU64; 3] = Default::default();
    store_bytes(&words, b"a pool name");
    let mut out = [0u8; 24];
    load_bytes(&words, &mut out);
    assert_eq!(&out[..11], b"a pool name");
    assert!(out[11..].iter().all(|&b| b == 0), "zero-padded");
}

#[test]
fn claim_words_name_their_run_and_nothing_else() {
    assert!(!Claims::names(0, 0), "0 names nothing");
    let w = Claims::word(10, 3);
    assert!((10..13).all(|p| Claims::names(w, p)));
    assert!(!Claims::names(w, 9) && !Claims::names(w, 13));
    // Positions compare modulo 2^56: a run across that boundary still names its cells.
    let first = (1u64 << 56) - 2;
    let w = Claims::word(first, 4);
    assert!((first..first + 4).all(|p| Claims::names(w, p)));
    assert!(!Claims::names(w, first + 4));
    // Back to full positions, below `end` and within a lap; the rest is dropped.
    let w = Claims::word(100, 5);
    assert_eq!(Claims::positions(w, 105, 16).collect::<Vec<_>>(), [100, 101, 102, 103, 104]);
    assert_eq!(Claims::positions(w, 103, 16).collect::<Vec<_>>(), [100, 101, 102]);
    assert_eq!(Claims::positions(w, 117, 16).collect::<Vec<_>>(), [101, 102, 103, 104]);
    assert_eq!(Claims::positions(w, 100, 16).count(), 0);
    assert_eq!(Claims::positions(0, 100, 16).count(), 0);
    let w = Claims::word(first, 4);
    assert_eq!(
        Claims::positions(w, first + 4, 8).collect::<Vec<_>>(),
        [first, first + 1, first + 2, first + 3]
    );
}

#[test]
fn layout_rejects_bad_capacity() {
    assert!(RingLayout::new(0, 8).is_none());
    assert!(RingLayout::new(3, 8).is_none());
    assert!(RingLayout::new(MAX_CAPACITY * 2, 8).is_none());
    assert!(RingLayout::new(4, usize::MAX / 2).is_none(), "overflow is None");
}

#[test]
fn layout_offsets() {
    let l = RingLayout::new(1024, 384).unwrap();
    assert_eq!((l.ring_header, l.control, l.participants, l.cells), (128, 256, 768, 9472));
    assert_eq!(l.total_size, 9472 + 1024 * 384);
}

#[test]
fn channel_layout() {
    let c = ChannelLayout::new(4, 64, 384).unwrap();
    assert_eq!((c.header, c.pools, c.ring.ring_header), (128, 256, 256 + 4 * 512));
    assert_eq!(c.total_size, c.ring.cells + 64 * 384);
    assert!(ChannelLayout::new(0, 64, 384).is_none());
    assert!(ChannelLayout::new(MAX_POOLS + 1, 64, 384).is_none());
    assert!(ChannelLayout::new(4, 3, 384).is_none());
}

#[test]
fn pool_layouts() {
    let p = PoolLayout::new(3, 1000).unwrap();
    assert_eq!(p.records, 256);
    assert_eq!(p.free_ring.ring_header, 512, "records end at 448, rounded up to 128");
    assert_eq!(p.free_ring.capacity, 8, "twice the slots, rounded up to a power of two");
    assert_eq!(p.sent % 128, 0);
    assert!(p.sent >= p.free_ring.total_size);
    assert_eq!(p.sent_offset(2), p.sent + 2 * SENT_COPY_SIZE);
    assert_eq!(p.headers % 4096, 0);
    assert!(p.headers >= p.sent + 3 * SENT_COPY_SIZE, "headers after the sent copies");
    assert_eq!(p.header_offset(2), p.headers + 2 * SLOT_HEADER_SIZE);
    assert_eq!(p.data, p.headers + 3 * SLOT_HEADER_SIZE, "slots after the headers");
    assert_eq!(p.stride, 1024, "small slots are 256-byte aligned");
    assert_eq!(p.total_size, p.data + 3 * 1024);
    assert_eq!(PoolLayout::new(2, 5000).unwrap().stride, 8192, "big slots page aligned");
    assert!(PoolLayout::new(0, 64).is_none());
    assert!(PoolLayout::new(4, 0).is_none());
    assert!(PoolLayout::new(MAX_SLOTS + 1, 64).is_none());
    assert!(PoolLayout::new(MAX_SLOTS, MAX_SLOT_SIZE).is_none(), "too large to map");

    let g = PoolLayout::cuda(3, 1000).unwrap();
    assert_eq!((g.records, g.free_ring, g.data), (p.records, p.free_ring, 0));
    assert_eq!(g.cuda_info % 128, 0);
    assert!(g.cuda_info >= g.free_ring.total_size);
    assert_eq!(g.slot_events, g.cuda_info + 128);
    assert!(g.sent >= g.slot_events + 3 * 128);
    assert!(g.headers >= g.sent + 3 * SENT_COPY_SIZE);
    assert_eq!(g.headers % 4096, 0);
    assert_eq!(g.total_size, g.headers + 3 * SLOT_HEADER_SIZE);
    assert_eq!(g.stride, 2 << 20, "device slots 2 MiB apart");
    assert_eq!(PoolLayout::cuda(1, (2 << 20) + 1).unwrap().stride, 4 << 20);
    assert_eq!(PoolLayout::for_backend(BACKEND_HOST, 3, 1000), Some(p));
    assert_eq!(PoolLayout::for_backend(9, 3, 1000), None);
}
