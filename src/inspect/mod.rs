//! Looking at segments from outside: what the `gpuring` tool's `inspect`, `list` and
//! `clean` show. Nothing here claims a role, leases a slot or moves a position; it reads
//! shared words and reports them (a snapshot, racing with the live processes).
//!
//! "In use" is judged by the lock that every handle of a segment holds on byte 0 of its
//! object for as long as it has it open (an open-file-description lock, dropped by the
//! kernel when the process dies; see `shm`), attached endpoints by their own locks (see
//! `liveness`), never by pids. Pool owners (senders) are shown by pid
//! ([`crate::liveness::process_state`]), which the kernel may have reused: there a "dead"
//! verdict is reliable and an "alive" one a best guess.

use std::time::{Duration, SystemTime};

mod report;

pub use crate::channel::PoolState;
pub use crate::layout::SegmentKind;
use crate::layout::{HeaderBytes, INIT_READY, LAYOUT_VERSION, MAGIC, RingView, SegmentHeader};
use crate::liveness::{ProcessState, process_state};
use crate::shm::{Removal, Segment, ShmError};
use crate::sync::Ordering;
pub use report::{
    Delivery, Inspection, Participant, PoolReport, ReadySignal, RingState, SlotCounts, SlotMemory,
    inspect,
};

/// Whether process `pid` runs, as far as the process table tells (`None` when it cannot:
/// pid 0, a value no pid can take, as a forged one may be, or no `/proc`). A zombie has
/// exited.
pub fn pid_alive(pid: u32) -> Option<bool> {
    match process_state(pid) {
        ProcessState::Running => Some(true),
        ProcessState::Exiting | ProcessState::Exited => Some(false),
        ProcessState::Unknown => None,
    }
}

/// A gpuring segment found in `/dev/shm`.
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
    /// The creating process (diagnostics only: pids are reused).
    pub creator_pid: u32,
    /// Whether the creator finished initialising it.
    pub initialized: bool,
    /// Whether some process has it open (`None`: the lock could not be probed).
    pub in_use: Option<bool>,
    /// Rings and channels: elements or messages waiting in the ring (`None` for pools, and
    /// for segments this version cannot read).
    pub queued: Option<u64>,
    /// How long since the object was last modified (its age, for an untouched segment).
    pub age: Option<Duration>,
    /// Broadcast rings and channels: how far behind the last position published each
    /// counted reader is, in the order of their places (`None` for the other kinds).
    pub readers: Option<Vec<u64>>,
}

impl SegmentInfo {
    /// Whether this is a slot pool (which belongs to a channel).
    pub fn is_pool(&self) -> bool {
        matches!(self.kind, Some(SegmentKind::HostPool | SegmentKind::CudaPool))
    }

    /// Where it stands: in use; waiting with elements queued (nobody has it open, and
    /// they wait for a consumer that may come); left over (nobody has it open and nothing
    /// waits in it: a crash left it, and `clean` removes it); for pools, whether its
    /// channel is still there. `all` is the rest of the listing (for a pool's channel).
    pub fn state(&self, all: &[SegmentInfo]) -> SegmentState {
        match (self.initialized, self.in_use, self.queued) {
            (false, _, _) => SegmentState::NotInitialized,
            (_, Some(true), _) => SegmentState::InUse,
            (_, None, _) => SegmentState::Unknown,
            (_, Some(false), _) if self.is_pool() => {
                if pool_has_channel(&self.name, all) {
                    SegmentState::PoolOfChannel
                } else {
                    SegmentState::OrphanedPool
                }
            }
            (_, Some(false), Some(n)) if n > 0 => SegmentState::Waiting { queued: n },
            (_, Some(false), _) => SegmentState::LeftOver,
        }
    }
}

/// Where a listed segment stands ([`SegmentInfo::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentState {
    /// Its creator never finished initialising it.
    NotInitialized,
    /// Some process has it open.
    InUse,
    /// Whether a process has it open could not be told.
    Unknown,
    /// A pool nobody has open, of a channel that is still there (messages in it may name
    /// the pool).
    PoolOfChannel,
    /// A pool whose channel is gone: `clean` removes it.
    OrphanedPool,
    /// A ring or channel nobody has open with elements waiting for a consumer that may
    /// come: `clean --queued` drops them.
    Waiting {
        /// Elements or messages waiting.
        queued: u64,
    },
    /// Nobody has it open and nothing waits in it: a crash left it, and `clean` removes it.
    LeftOver,
}

/// The channel a pool segment belongs to, and the nonce of the channel instance that made
/// it, from its name (`{channel}.{nonce}.p{i}.{n}`).
fn owner_of(pool: &str) -> Option<(&str, u32)> {
    let mut parts = pool.rsplitn(4, '.');
    let (_, _, nonce, channel) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    Some((channel, u32::from_str_radix(nonce, 16).ok()?))
}

/// Whether the channel instance that made pool `pool` is still there: its channel is in
/// `all` and carries the nonce of the pool's name (a pool of an earlier channel of the same
/// name, which `replace_stale` or a crash left, is orphaned too). A channel whose nonce
/// cannot be read keeps its pools.
fn pool_has_channel(pool: &str, all: &[SegmentInfo]) -> bool {
    let Some((channel, nonce)) = owner_of(pool) else {
        return false;
    };
    let nonce_now = || {
        let (seg, _) = Segment::open_any(channel, Duration::ZERO).ok()?;
        Some(crate::channel::channel_layout(&seg)?.1)
    };
    all.iter().any(|i| i.name == channel && i.kind.is_some_and(SegmentKind::is_channel))
        && nonce_now().is_none_or(|n| n == nonce)
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
    use std::os::fd::AsFd;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() < size_of::<SegmentHeader>() as u64 {
        return None;
    }
    let mut head = [0u8; HeaderBytes::LEN];
    let mut file = std::fs::File::open(path).ok()?;
    file.read_exact(&mut head).ok()?;
    let head = HeaderBytes::parse(&head);
    if head.magic != MAGIC {
        return None;
    }
    let name = path.file_name()?.to_string_lossy().into_owned();
    let kind = SegmentKind::from_raw(head.kind);
    let opened = match kind {
        Some(SegmentKind::HostPool | SegmentKind::CudaPool) | None => None,
        Some(_) => Segment::open_any(&name, Duration::ZERO).ok(),
    };
    let queued = opened.as_ref().and_then(|(seg, kind)| queued_in(seg, *kind));
    let readers = opened.as_ref().and_then(|(seg, kind)| readers_in(seg, *kind));
    Some(SegmentInfo {
        kind,
        version: head.version,
        size: meta.len(),
        creator_pid: head.creator_pid,
        initialized: head.init == INIT_READY,
        in_use: crate::shm::presence_held(file.as_fd()).ok(),
        queued,
        age: meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()),
        readers,
        name,
    })
}

/// A broadcast ring's or channel's counted readers: how far each is behind `tail` (a
/// snapshot; `None` for the other kinds, or positions beyond the segment).
fn readers_in(seg: &Segment, kind: SegmentKind) -> Option<Vec<u64>> {
    if !matches!(kind, SegmentKind::BroadcastRing | SegmentKind::BroadcastChannel) {
        return None;
    }
    let ring = RingView::at(seg, ring_base(seg, kind)?)?;
    // Relaxed: a snapshot.
    let mask = ring.header.readers.load(Ordering::Relaxed);
    let tail = ring.control.tail.load(Ordering::Relaxed);
    let capacity = ring.header.capacity.load(Ordering::Relaxed);
    let behind = |i: usize| {
        // Relaxed: a snapshot.
        let cursor = ring.participants.claims[i].pop.load(Ordering::Relaxed);
        tail.wrapping_sub(cursor).min(capacity)
    };
    Some(
        (0..crate::ring::broadcast::MAX_READERS)
            .filter(|i| mask & (1 << i) != 0)
            .map(behind)
            .collect(),
    )
}

/// The ring of a ring or channel segment: where its header sits (`None` for pools, or a
/// channel whose table size is impossible).
fn ring_base(seg: &Segment, kind: SegmentKind) -> Option<usize> {
    match kind {
        SegmentKind::SpscRing | SegmentKind::MpmcRing | SegmentKind::BroadcastRing => {
            Some(size_of::<SegmentHeader>())
        }
        SegmentKind::SpscChannel | SegmentKind::MpmcChannel | SegmentKind::BroadcastChannel => {
            Some(crate::channel::channel_layout(seg)?.0.ring.ring_header)
        }
        SegmentKind::HostPool | SegmentKind::CudaPool => None,
    }
}

/// Elements waiting in the ring of a ring or channel segment (`None`: not one, or its
/// positions are impossible).
fn queued_in(seg: &Segment, kind: SegmentKind) -> Option<u64> {
    if matches!(kind, SegmentKind::BroadcastRing | SegmentKind::BroadcastChannel) {
        // A broadcast ring keeps nothing for a reader that comes later.
        return Some(0);
    }
    RingView::at(seg, ring_base(seg, kind)?)?.queued()
}

/// A segment `clean` removed (or, dry, would remove), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// Object name, without the leading `/`.
    pub name: String,
    /// Why it went.
    pub why: CleanReason,
}

/// Why `clean` removed a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanReason {
    /// Of another layout version (or a kind this version does not know), not in use.
    OtherVersion,
    /// Its creator never finished it, and nobody has it open.
    NeverInitialized,
    /// Nothing queued in it, nobody has it open: left by a crash.
    LeftOver,
    /// With `--queued`: elements were waiting, and nobody had it open.
    Queued(u64),
    /// With `--queued`: its positions could not be read, and nobody had it open.
    UnreadablePositions,
    /// A pool whose channel is gone.
    OrphanedPool,
}

/// Removes what nobody uses: segments no process has open and nothing waits in (left by a
/// crash), pools whose channel is gone, segments of another layout version or never
/// initialised that nobody has open. With `queued`, also rings and channels that nobody
/// has open although elements wait in them (for a consumer that has not come): they are
/// dropped. A segment in use is never removed; a channel goes with its pools. Only names
/// that start with `prefix` are considered (`""`: all). With `dry_run`, only says what it
/// would remove.
///
/// Each removal takes the segment's presence byte exclusively first (no process can open
/// it meanwhile), and decides on what it then reads.
///
/// # Errors
///
/// [`ShmError::Io`] when `/dev/shm` cannot be listed.
pub fn clean(dry_run: bool, queued: bool, prefix: &str) -> Result<Vec<Cleaned>, ShmError> {
    let mut all = list()?;
    all.retain(|i| i.name.starts_with(prefix.trim_start_matches('/')));
    let mut cleaned = Vec::new();
    // Rings and channels first: a channel takes its pools with it.
    for info in all.iter().filter(|i| !i.is_pool() && i.in_use == Some(false)) {
        let why = match (info.kind, info.version == LAYOUT_VERSION, info.queued) {
            (None, _, _) | (_, false, _) => CleanReason::OtherVersion,
            _ if !info.initialized => CleanReason::NeverInitialized,
            (_, _, Some(0)) => CleanReason::LeftOver,
            (_, _, Some(n)) if queued => CleanReason::Queued(n),
            (_, _, None) if queued => CleanReason::UnreadablePositions,
            _ => continue,
        };
        if dry_run || remove_unused(&info.name, queued) {
            cleaned.push(Cleaned { name: info.name.clone(), why });
        }
    }
    let gone: Vec<String> = cleaned.iter().map(|c| c.name.clone()).collect();
    for info in all.iter().filter(|i| i.is_pool() && i.in_use == Some(false)) {
        let with_channel = owner_of(&info.name).is_some_and(|(c, _)| gone.iter().any(|g| g == c));
        if !with_channel && pool_has_channel(&info.name, &all) {
            continue; // its channel keeps it (messages in it may name this pool)
        }
        let removal = if dry_run {
            Removal::Removed
        } else {
            match Segment::remove_if_unattended(&info.name, |_| true) {
                // Removed with its channel just now: reported as a dry run would.
                Ok(Removal::Absent) if with_channel => Removal::Removed,
                r => r.unwrap_or(Removal::InUse),
            }
        };
        if removal == Removal::Removed {
            cleaned.push(Cleaned { name: info.name.clone(), why: CleanReason::OrphanedPool });
        }
    }
    Ok(cleaned)
}

/// Bytes a new segment can take now: what `/dev/shm` has free for this user, and no more
/// than the memory the kernel says is available (tmpfs pages are memory). `None` where
/// neither can be read. What `create` checks a segment's size against.
///
/// ```
/// if let Some(free) = gpuring::inspect::shm_available() {
///     println!("room for {} slots of 1 MiB", free >> 20);
/// }
/// ```
pub fn shm_available() -> Option<u64> {
    crate::shm::available()
}

/// Removes segment `name` (a channel with its pools) if no process has it open, dropping
/// whatever waits in it: `Ok(true)`; `Ok(false)` while a process uses it. For one name what
/// `clean --queued` does for all.
///
/// ```no_run
/// // A channel that a crashed run left with messages nobody will come for.
/// if !gpuring::inspect::remove("frames")? {
///     eprintln!("frames is in use");
/// }
/// # Ok::<(), gpuring::ShmError>(())
/// ```
///
/// # Errors
///
/// [`ShmError::NotFound`] when no object has that name; [`ShmError::InvalidName`],
/// [`ShmError::Io`].
pub fn remove(name: &str) -> Result<bool, ShmError> {
    if !Segment::exists(name)? {
        let name = crate::shm::object_name(name)?.to_string_lossy().into_owned();
        return Err(ShmError::NotFound { name });
    }
    Ok(remove_unused(name, true))
}

/// Removes ring or channel `name` if nobody has it open, and (unless `queued`) nothing
/// waits in it; a channel's pools go with it. Decided on what is read under the exclusive
/// lock.
fn remove_unused(name: &str, queued: bool) -> bool {
    let may_go = |seg: &Segment| {
        let kind = SegmentKind::from_raw(seg.header().kind.load(Ordering::Relaxed));
        let version = seg.header().version.load(Ordering::Relaxed);
        let (Some(kind), LAYOUT_VERSION) = (kind, version) else {
            return true; // another layout: nobody of this version can use it
        };
        if !queued && kind.is_ring_or_channel() && queued_in(seg, kind) != Some(0) {
            return false;
        }
        if kind.is_channel() {
            crate::channel::remove_pools_of(seg, name);
        }
        true
    };
    matches!(Segment::remove_if_unattended(name, may_go), Ok(Removal::Removed))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use core::sync::atomic::Ordering;
    use std::time::Duration;

    use super::report::ReadySignal;
    use crate::layout::{BACKEND_CUDA, BACKEND_HOST, PoolLayout, PoolView, SegmentKind};
    use crate::shm::{Segment, ShmError};

    /// A device pool's ordering word, as `inspect` reads it: each value the library writes
    /// by name, any other as corrupt; host pools have none. (A segment of the device
    /// pool's shape, made here: no GPU is needed to read one.)
    #[test]
    #[cfg_attr(miri, ignore = "shared memory objects are not available under Miri")]
    fn a_device_pools_ready_signal_is_read_by_name() {
        let name = format!("gpuring-inspect-ready-{}", std::process::id());
        let (count, size) = (2, 4096);
        let layout = PoolLayout::for_backend(BACKEND_CUDA, count, size).unwrap();
        let seg = Segment::create::<ShmError>(
            &name,
            SegmentKind::CudaPool,
            layout.total_size,
            false,
            |_| Ok(()),
        )
        .unwrap();
        let opened = Segment::open_any(&name, Duration::ZERO).map(|(s, _)| s);
        Segment::unlink(&name).unwrap();
        let opened = opened.unwrap();
        let info = PoolView::of(&seg, &layout).unwrap().cuda_info.unwrap();
        let read = |backend, count| {
            let layout = PoolLayout::for_backend(backend, count, size).unwrap();
            PoolView::of(&opened, &layout).and_then(|p| super::report::ready_signal(&p))
        };
        for (word, said) in [
            (0, ReadySignal::Events),
            (1, ReadySignal::HostFlags),
            (2, ReadySignal::Corrupt),
            (u32::MAX, ReadySignal::Corrupt),
        ] {
            info.ordering.store(word, Ordering::Relaxed);
            assert_eq!(read(BACKEND_CUDA, count), Some(said), "{word}");
        }
        // A host pool's layout is of another size: not read as a pool; a host pool of the
        // right size has no ready signal.
        assert_eq!(read(BACKEND_HOST, count), None);
        // A segment of another size than its parameters say is not read.
        assert_eq!(read(BACKEND_CUDA, count + 1), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "/proc is not available under Miri")]
    fn pid_alive_says_unknown_for_pids_that_cannot_exist() {
        assert_eq!(super::pid_alive(0), None);
        assert_eq!(super::pid_alive(u32::MAX), None);
        assert_eq!(super::pid_alive(1 << 31), None);
        assert_eq!(super::pid_alive(std::process::id()), Some(true));
    }
}
