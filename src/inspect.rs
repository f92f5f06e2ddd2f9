//! Looking at segments from outside: what the `gpuring` tool's `inspect`, `list` and
//! `clean` show. Nothing here claims a role, leases a slot or moves a position; it reads
//! shared words once and reports them (a snapshot, racing with the live processes).
//!
//! Liveness is judged by the locks that segment creators and attached endpoints hold on
//! bytes of the segment's object (open-file-description locks, dropped by the kernel when
//! the process dies; see `liveness`), not by pids. Pool owners (senders), which hold no
//! lock of their own beyond their pool segment's creator lock, and segments of older
//! layouts fall back to the pid ([`crate::liveness::process_state`]), which the kernel may
//! have reused: there a "dead" verdict is reliable and an "alive" one a best guess.

use std::time::{Duration, SystemTime};

pub use crate::layout::SegmentKind;
use crate::layout::{
    ChannelHeader, ChannelLayout, Corrupted, MAGIC, PARTICIPANT_CONSUMER, PARTICIPANT_PRODUCER,
    Participants, PoolEntry, PoolHeader, PoolLayout, RingControl, RingHeader, SegmentHeader,
    SlotRecord, load_bytes,
};
use crate::liveness::{ProcessState, process_state};
use crate::shm::{Segment, ShmError};
use crate::sync::Ordering;

/// Whether process `pid` runs, as far as the process table tells (`None` when it cannot:
/// pid 0, a value no pid can take, as a forged one may be, or no `/proc`). A zombie has
/// exited.
pub fn pid_alive(pid: u32) -> Option<bool> {
    match process_state(pid) {
        ProcessState::Running => Some(true),
        ProcessState::Exited => Some(false),
        ProcessState::Unknown => None,
    }
}

/// A gpuring segment found in `/dev/shm`, read from its header without mapping it.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    /// Object name, without the leading `/`.
    pub name: String,
    /// The kind its header states (`None`: a kind this version does not know).
    pub kind: Option<SegmentKind>,
    /// Layout version.
    pub version: u32,
    /// Size of the object in bytes.
    pub size: u64,
    /// The creating process.
    pub creator_pid: u32,
    /// Whether the creator finished initialising it.
    pub initialized: bool,
    /// Whether the creator still runs (its liveness lock; see the module docs).
    pub creator_alive: Option<bool>,
    /// How long since the object was last modified (its age, for an untouched segment).
    pub age: Option<Duration>,
}

/// Every gpuring segment (right magic) in `/dev/shm` this process can read.
///
/// # Errors
///
/// [`ShmError::Io`] when `/dev/shm` cannot be listed.
pub fn list() -> Result<Vec<SegmentInfo>, ShmError> {
    let dir = std::fs::read_dir("/dev/shm")
        .map_err(|source| ShmError::Io { op: "read_dir /dev/shm", source })?;
    let mut found: Vec<SegmentInfo> = dir.filter_map(|e| read_info(&e.ok()?.path())).collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

fn read_info(path: &std::path::Path) -> Option<SegmentInfo> {
    use std::io::Read;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() < size_of::<SegmentHeader>() as u64 {
        return None;
    }
    let mut head = [0u8; 32];
    let mut file = std::fs::File::open(path).ok()?;
    file.read_exact(&mut head).ok()?;
    let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    if u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) != MAGIC {
        return None;
    }
    let creator_pid = word(24);
    Some(SegmentInfo {
        name: path.file_name()?.to_string_lossy().into_owned(),
        kind: SegmentKind::from_raw(word(12)),
        version: word(8),
        size: meta.len(),
        creator_pid,
        initialized: word(28) == crate::layout::INIT_READY,
        creator_alive: {
            use std::os::fd::AsFd;
            crate::shm::creator_lock_held(file.as_fd()).ok().or_else(|| pid_alive(creator_pid))
        },
        age: meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()),
    })
}

/// Positions and waiters of a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingState {
    /// Cells.
    pub capacity: u64,
    /// Bytes per element.
    pub elem_size: u32,
    /// Next position to read.
    pub head: u64,
    /// Next position to write.
    pub tail: u64,
    /// Threads asleep waiting for an element.
    pub waiting_consumers: u32,
    /// Threads asleep waiting for room.
    pub waiting_producers: u32,
    /// SPSC: the producer role's holder (pid, alive), if any.
    pub producer: Option<(u32, Option<bool>)>,
    /// SPSC: the consumer role's holder (pid, alive), if any.
    pub consumer: Option<(u32, Option<bool>)>,
    /// The participant table: every attached endpoint, and dead ones not yet replaced.
    pub participants: Vec<Participant>,
}

/// An entry of a ring's participant table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// Entry index.
    pub index: usize,
    /// `"producer"` or `"consumer"` (or `"unknown"` for a code this version does not know).
    pub role: &'static str,
    /// The pid it recorded.
    pub pid: u32,
    /// Whether its liveness lock is held.
    pub alive: bool,
}

impl RingState {
    /// Elements in the ring (0 if the positions are impossible).
    pub fn depth(&self) -> u64 {
        self.tail.checked_sub(self.head).filter(|d| *d <= self.capacity).unwrap_or(0)
    }
}

/// Slots of a pool by state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotCounts {
    /// In the free ring.
    pub free: u32,
    /// Leased by the sender, not yet sent.
    pub leased: u32,
    /// Sent, not yet received.
    pub in_flight: u32,
    /// Held by a receiver.
    pub held: u32,
}

/// A pool as the channel's table and the pool's own segment describe it.
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// Table row.
    pub index: u32,
    /// Registration instance.
    pub instance: u32,
    /// "registering", "active" or "closed".
    pub state: &'static str,
    /// The sender's pid and whether it runs.
    pub owner: (u32, Option<bool>),
    /// Pool segment name.
    pub name: String,
    /// 1 host, 2 CUDA.
    pub backend: u32,
    /// Slots.
    pub slot_count: u32,
    /// Bytes per slot.
    pub slot_size: u64,
    /// Slots by state (`None`: the pool segment could not be opened).
    pub slots: Option<SlotCounts>,
}

/// What `inspect` found in a segment.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// Object name as given.
    pub name: String,
    /// Its kind.
    pub kind: SegmentKind,
    /// Size in bytes.
    pub size: usize,
    /// The creator (pid, alive).
    pub creator: (u32, Option<bool>),
    /// The ring (rings and channels).
    pub ring: Option<RingState>,
    /// The pools (channels: one per table row in use; a pool segment: itself).
    pub pools: Vec<PoolReport>,
}

/// Opens segment `name` read-only in spirit (nothing is claimed or changed) and reports it.
///
/// # Errors
///
/// What [`Segment::open_any`] returns; [`ShmError::Corrupted`] when the parameters in the
/// segment are impossible.
pub fn inspect(name: &str) -> Result<Inspection, ShmError> {
    let (seg, kind) = Segment::open_any(name, Duration::from_millis(100))?;
    let h = seg.header();
    // Relaxed: `open_any` synchronised with the creator through `init`.
    let creator_pid = h.creator_pid.load(Ordering::Relaxed);
    let corrupted = |what| ShmError::Corrupted(Corrupted { what });
    let mut report = Inspection {
        name: name.to_owned(),
        kind,
        size: seg.len(),
        creator: (creator_pid, seg.creator_alive().ok()),
        ring: None,
        pools: Vec::new(),
    };
    match kind {
        SegmentKind::SpscRing | SegmentKind::MpmcRing => {
            report.ring = Some(ring_state(&seg, size_of::<SegmentHeader>(), kind)?);
        }
        SegmentKind::SpscChannel | SegmentKind::MpmcChannel => {
            // SAFETY: `open_any` checked the mapping holds at least a header; `at` checks
            // the bounds of what follows; atomics only.
            let ch = unsafe { seg.at::<ChannelHeader>(size_of::<SegmentHeader>()).as_ref() };
            let max_pools = ch.max_pools.load(Ordering::Relaxed);
            let layout = ChannelLayout::new(max_pools, 1, 0)
                .ok_or(corrupted("channel pool table size out of range"))?;
            if layout.ring.cells > seg.len() {
                return Err(corrupted("channel smaller than its pool table"));
            }
            report.ring = Some(ring_state(&seg, layout.ring.ring_header, kind)?);
            for index in 0..max_pools {
                let at = layout.pools + index as usize * size_of::<PoolEntry>();
                // SAFETY: inside the table (checked above); atomics only.
                let e = unsafe { seg.at::<PoolEntry>(at).as_ref() };
                if let Some(p) = pool_report(index, e) {
                    report.pools.push(p);
                }
            }
        }
        SegmentKind::HostPool | SegmentKind::CudaPool => {
            // SAFETY: as above.
            let p = unsafe { seg.at::<PoolHeader>(size_of::<SegmentHeader>()).as_ref() };
            let (count, size, backend) = (
                p.slot_count.load(Ordering::Relaxed),
                p.slot_size.load(Ordering::Relaxed),
                p.backend.load(Ordering::Relaxed),
            );
            let owner = p.owner_pid.load(Ordering::Relaxed);
            report.pools.push(PoolReport {
                index: 0,
                instance: 0,
                state: if p.closed.load(Ordering::Relaxed) == 1 { "closed" } else { "active" },
                owner: (owner, pid_alive(owner)),
                name: name.trim_start_matches('/').to_owned(),
                backend,
                slot_count: count,
                slot_size: size,
                slots: slot_counts(&seg, backend, count, size),
            });
        }
    }
    Ok(report)
}

fn ring_state(seg: &Segment, base: usize, kind: SegmentKind) -> Result<RingState, ShmError> {
    // SAFETY: `at` checks the bounds; atomics only.
    let rh = unsafe { seg.at::<RingHeader>(base).as_ref() };
    // SAFETY: as above.
    let c = unsafe { seg.at::<RingControl>(base + size_of::<RingHeader>()).as_ref() };
    let spsc = matches!(kind, SegmentKind::SpscRing | SegmentKind::SpscChannel);
    let at = base + size_of::<RingHeader>() + size_of::<RingControl>();
    // SAFETY: as above.
    let table = unsafe { seg.at::<Participants>(at).as_ref() };
    let mut participants = Vec::new();
    for (index, entry) in table.entries.iter().enumerate() {
        // Relaxed: a snapshot, checked against the lock.
        let value = entry.load(Ordering::Relaxed);
        if value == 0 {
            continue;
        }
        let role = match (value >> 32) as u32 {
            PARTICIPANT_PRODUCER => "producer",
            PARTICIPANT_CONSUMER => "consumer",
            _ => "unknown",
        };
        let alive = seg
            .byte_held_elsewhere(1 + index as u64)
            .map_err(|source| ShmError::Io { op: "fcntl(F_OFD_GETLK)", source })?;
        participants.push(Participant { index, role, pid: value as u32, alive });
    }
    let holder = |pid: u32, role: &str| {
        (spsc && pid != 0).then(|| {
            let live = participants.iter().any(|p| p.alive && p.pid == pid && p.role == role);
            (pid, Some(live))
        })
    };
    // Relaxed: a snapshot.
    Ok(RingState {
        capacity: rh.capacity.load(Ordering::Relaxed),
        elem_size: rh.elem_size.load(Ordering::Relaxed),
        head: c.head.load(Ordering::Relaxed),
        tail: c.tail.load(Ordering::Relaxed),
        waiting_consumers: c.not_empty.sleepers(),
        waiting_producers: c.not_full.sleepers(),
        producer: holder(rh.producer_claim.load(Ordering::Relaxed), "producer"),
        consumer: holder(rh.consumer_claim.load(Ordering::Relaxed), "consumer"),
        participants,
    })
}

fn pool_report(index: u32, e: &PoolEntry) -> Option<PoolReport> {
    // Acquire: pairs with the Release store of the state by the registering sender.
    let state = match e.state.load(Ordering::Acquire) {
        PoolEntry::CLAIMED => "registering",
        PoolEntry::ACTIVE => "active",
        PoolEntry::CLOSED => "closed",
        _ => return None,
    };
    let len = (e.name_len.load(Ordering::Relaxed) as usize).min(crate::layout::POOL_NAME_BYTES);
    let mut bytes = [0u8; crate::layout::POOL_NAME_BYTES];
    load_bytes(&e.name, &mut bytes);
    let name = String::from_utf8_lossy(&bytes[..len]).into_owned();
    let (backend, count, size) = (
        e.backend.load(Ordering::Relaxed),
        e.slot_count.load(Ordering::Relaxed),
        e.slot_size.load(Ordering::Relaxed),
    );
    let owner = e.owner_pid.load(Ordering::Relaxed);
    let slots = Segment::open_any(&name, Duration::ZERO)
        .ok()
        .and_then(|(seg, _)| slot_counts(&seg, backend, count, size));
    Some(PoolReport {
        index,
        instance: e.instance.load(Ordering::Relaxed),
        state,
        owner: (owner, pid_alive(owner)),
        name,
        backend,
        slot_count: count,
        slot_size: size,
        slots,
    })
}

fn slot_counts(seg: &Segment, backend: u32, count: u32, size: u64) -> Option<SlotCounts> {
    let layout = PoolLayout::for_backend(backend, count, size)?;
    if layout.total_size != seg.len() {
        return None;
    }
    let mut counts = SlotCounts::default();
    for i in 0..layout.slot_count {
        // SAFETY: record i of a layout whose size equals the mapping; atomics only.
        let r = unsafe { seg.at::<SlotRecord>(layout.records + i * size_of::<SlotRecord>()) };
        // SAFETY: as above.
        let word = unsafe { r.as_ref() }.state.load(Ordering::Relaxed);
        match word as u32 {
            0 => counts.free += 1,
            1 => counts.leased += 1,
            2 => counts.in_flight += 1,
            _ => counts.held += 1,
        }
    }
    Some(counts)
}

/// Removes the segments whose creator is dead (never one whose creator runs, or whose
/// liveness is unknown; never a pool of a channel whose creator runs, which may still
/// hold messages from a sender that left). With `dry_run`, only says which. Returns the names removed (or
/// that would be).
///
/// # Errors
///
/// [`ShmError::Io`] when `/dev/shm` cannot be listed.
pub fn clean(dry_run: bool) -> Result<Vec<String>, ShmError> {
    let all = list()?;
    let live_channel = |pool: &str| {
        // A pool is named `{channel}.{nonce:08x}.p{index}.{instance}`: while its channel's
        // creator runs, messages from a departed sender may still be waiting for it.
        let channel = pool.rsplitn(4, '.').nth(3).unwrap_or("");
        all.iter().any(|i| i.name == channel && i.creator_alive != Some(false))
    };
    let mut removed = Vec::new();
    for info in &all {
        let pool = matches!(info.kind, Some(SegmentKind::HostPool | SegmentKind::CudaPool));
        if info.creator_alive == Some(false) && !(pool && live_channel(&info.name)) {
            if !dry_run && Segment::unlink(&info.name).is_err() {
                continue;
            }
            removed.push(info.name.clone());
        }
    }
    Ok(removed)
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    #[cfg_attr(miri, ignore = "/proc is not available under Miri")]
    fn pid_alive_says_unknown_for_pids_that_cannot_exist() {
        assert_eq!(super::pid_alive(0), None);
        assert_eq!(super::pid_alive(u32::MAX), None);
        assert_eq!(super::pid_alive(1 << 31), None);
        assert_eq!(super::pid_alive(std::process::id()), Some(true));
    }
}
