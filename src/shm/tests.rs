//! Unit tests of named segments.

use super::*;

#[test]
fn names_are_checked() {
    assert_eq!(object_name("abc").unwrap().to_str().unwrap(), "/abc");
    assert_eq!(object_name("/abc").unwrap().to_str().unwrap(), "/abc");
    for bad in ["", "/", "a/b", "/a/b", "..", "a\0b"] {
        assert!(matches!(object_name(bad), Err(ShmError::InvalidName { .. })), "{bad:?}");
    }
    assert!(object_name(&"x".repeat(251)).is_err());
}

#[test]
#[cfg_attr(miri, ignore = "shm_open and mmap are not available under Miri")]
fn create_that_fails_half_way_leaves_nothing() {
    let name = format!("gpuring-unit-halfway-{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    let failed = Corrupted { what: "a body that cannot be written" };
    let r = Segment::create(&name, SegmentKind::SpscRing, 4096, false, |seg| {
        assert!(std::fs::metadata(&path).is_ok(), "the object exists while initialising");
        assert_eq!(seg.header().init.load(Ordering::Relaxed), 0, "not yet published");
        Err(ShmError::Corrupted(failed))
    });
    assert!(matches!(r, Err(ShmError::Corrupted(c)) if c == failed));
    assert!(std::fs::metadata(&path).is_err(), "a failed create unlinks its object");
    // The name is free again.
    let seg = Segment::create(&name, SegmentKind::SpscRing, 4096, false, |_| Ok::<_, ShmError>(()))
        .unwrap();
    assert_eq!(seg.header().init.load(Ordering::Acquire), INIT_READY);
    drop(seg);
    assert!(std::fs::metadata(&path).is_ok(), "no last-out check: its handles never remove it");
    Segment::unlink(&name).unwrap();
}
