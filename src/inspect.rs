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

pub use crate::layout::SegmentKind;
use crate::layout::{
    BACKEND_CUDA, Corrupted, CudaPoolInfo, MAGIC, PARTICIPANT_CONSUMER, PARTICIPANT_PRODUCER,
    Participants, PoolEntry, PoolHeader, PoolLayout, RingControl, RingHeader, SegmentHeader,
    SlotRecord, entry_pid, entry_role, entry_serial, load_bytes, participant_of,
};
use crate::liveness::{ProcessState, process_state};
use crate::pool::Phase;
use crate::shm::{Removal, Segment, ShmError};
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
}

impl SegmentInfo {
    /// Whether this is a slot pool (which belongs to a channel).
    pub fn is_pool(&self) -> bool {
        matches!(self.kind, Some(SegmentKind::HostPool | SegmentKind::CudaPool))
    }

    /// Its state in a word or three: "in use"; "waiting: N queued" (nobody has it open,
    /// and elements wait for a consumer that may come); "left over" (nobody has it open and
    /// nothing waits in it: a crash left it, and `clean` removes it); for pools, "pool of
    /// a channel" or "orphaned pool" (its channel is gone).
    pub fn state(&self, all: &[SegmentInfo]) -> String {
        match (self.in_use, self.queued) {
            (Some(true), _) => "in use".to_owned(),
            (None, _) => "unknown".to_owned(),
            (Some(false), _) if self.is_pool() => {
                if pool_has_channel(&self.name, all) {
                    "pool of a channel".to_owned()
                } else {
                    "orphaned pool".to_owned()
                }
            }
            (Some(false), Some(n)) if n > 0 => format!("waiting: {n} queued"),
            (Some(false), _) => "left over".to_owned(),
        }
    }
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
    let mut head = [0u8; 32];
    let mut file = std::fs::File::open(path).ok()?;
    file.read_exact(&mut head).ok()?;
    let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    if u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) != MAGIC {
        return None;
    }
    let name = path.file_name()?.to_string_lossy().into_owned();
    let kind = SegmentKind::from_raw(word(12));
    let queued = match kind {
        Some(SegmentKind::HostPool | SegmentKind::CudaPool) | None => None,
        Some(_) => Segment::open_any(&name, Duration::ZERO)
            .ok()
            .and_then(|(seg, kind)| queued_in(&seg, kind)),
    };
    Some(SegmentInfo {
        kind,
        version: word(8),
        size: meta.len(),
        creator_pid: word(24),
        initialized: word(28) == crate::layout::INIT_READY,
        in_use: crate::shm::presence_held(file.as_fd()).ok(),
        queued,
        age: meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()),
        name,
    })
}

/// The ring of a ring or channel segment: where its header sits (`None` for pools, or a
/// channel whose table size is impossible).
fn ring_base(seg: &Segment, kind: SegmentKind) -> Option<usize> {
    match kind {
        SegmentKind::SpscRing | SegmentKind::MpmcRing => Some(size_of::<SegmentHeader>()),
        SegmentKind::SpscChannel | SegmentKind::MpmcChannel => {
            Some(crate::channel::channel_layout(seg)?.0.ring.ring_header)
        }
        SegmentKind::HostPool | SegmentKind::CudaPool => None,
    }
}

/// Elements waiting in the ring of a ring or channel segment (`None`: not one, or its
/// positions are impossible).
fn queued_in(seg: &Segment, kind: SegmentKind) -> Option<u64> {
    let base = ring_base(seg, kind)?;
    // SAFETY: `at` checks the bounds; atomics only.
    let rh = unsafe { seg.at::<RingHeader>(base).as_ref() };
    // SAFETY: as above.
    let c = unsafe { seg.at::<RingControl>(base + size_of::<RingHeader>()).as_ref() };
    // Relaxed: a snapshot.
    let (head, tail) = (c.head.load(Ordering::Relaxed), c.tail.load(Ordering::Relaxed));
    tail.checked_sub(head).filter(|&d| d <= rh.capacity.load(Ordering::Relaxed))
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
    /// SPSC: the producer role's holder (pid, alive), if any (pid 0, not alive: the
    /// registration it names is no longer in the table).
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
    /// Device pools: how the sender signals that a slot's writes are done, as its segment
    /// says: "events" (`GpuReady::Event`), "host flags" (`GpuReady::HostFlag`) or
    /// "corrupt" (a value that is neither).
    /// `None` for host pools, or when the segment could not be opened.
    pub ready: Option<&'static str>,
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
    /// The creating process (diagnostics only: pids are reused).
    pub creator_pid: u32,
    /// Whether some process has it open.
    pub in_use: Option<bool>,
    /// The ring (rings and channels).
    pub ring: Option<RingState>,
    /// Whether the ring's positions moved while it was being read: its figures are then
    /// not one snapshot (head, tail and depth may come from different instants).
    pub moving: bool,
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
        creator_pid,
        in_use: seg.in_use_elsewhere().ok(),
        ring: None,
        moving: false,
        pools: Vec::new(),
    };
    // The channel's layout, read once: its table size is shared memory, and a second read
    // could disagree with the first.
    let is_channel = matches!(kind, SegmentKind::SpscChannel | SegmentKind::MpmcChannel);
    let channel = is_channel.then(|| crate::channel::channel_layout(&seg)).flatten();
    let channel = channel.map(|(layout, _)| layout);
    let base = if is_channel { channel.map(|l| l.ring.ring_header) } else { ring_base(&seg, kind) };
    if let Some(base) = base {
        let first = ring_state(&seg, base, kind)?;
        // Read again: positions that moved meanwhile mean the figures are no snapshot.
        let again = ring_state(&seg, base, kind)?;
        report.moving = (first.head, first.tail) != (again.head, again.tail);
        report.ring = Some(first);
    } else if is_channel {
        return Err(corrupted("channel pool table size out of range or beyond the segment"));
    }
    match kind {
        SegmentKind::SpscRing | SegmentKind::MpmcRing => {}
        SegmentKind::SpscChannel | SegmentKind::MpmcChannel => {
            let layout = channel.expect("a channel without a layout returned above");
            for index in 0..layout.max_pools as u32 {
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
                ready: ready_signal(&seg, backend, count, size),
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
    let mut serials = Vec::new();
    for (index, entry) in table.entries.iter().enumerate() {
        // Relaxed: a snapshot, checked against the lock.
        let value = entry.load(Ordering::Relaxed);
        if value == 0 {
            continue;
        }
        let role = match entry_role(value) {
            PARTICIPANT_PRODUCER => "producer",
            PARTICIPANT_CONSUMER => "consumer",
            _ => "unknown",
        };
        let alive = seg
            .byte_held_elsewhere(1 + index as u64)
            .map_err(|source| ShmError::Io { op: "fcntl(F_OFD_GETLK)", source })?;
        let serial = entry_serial(value);
        participants.push(Participant { index, role, pid: entry_pid(value), alive });
        serials.push((index, serial));
    }
    // An SPSC role names its holder's identity: its entry and registration serial.
    let holder = |id: u32, role: &str| {
        let (index, serial) = participant_of(id).filter(|_| spsc)?;
        let p = participants
            .iter()
            .zip(&serials)
            .find(|(p, s)| p.index == index && p.role == role && **s == (index, serial));
        Some(p.map_or((0, Some(false)), |(p, _)| (p.pid, Some(p.alive))))
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
    let state = match PoolEntry::code(e.state.load(Ordering::Acquire)) {
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
    let pool = Segment::open_any(&name, Duration::ZERO).ok();
    let slots = pool.as_ref().and_then(|(seg, _)| slot_counts(seg, backend, count, size));
    let ready = pool.as_ref().and_then(|(seg, _)| ready_signal(seg, backend, count, size));
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
        ready,
    })
}

/// The layout of pool segment `seg` as its table row says, if the mapping has its size.
fn pool_layout(seg: &Segment, backend: u32, count: u32, size: u64) -> Option<PoolLayout> {
    PoolLayout::for_backend(backend, count, size).filter(|l| l.total_size == seg.len())
}

/// A device pool's ready signal, as its [`CudaPoolInfo::ordering`] word says.
fn ready_signal(seg: &Segment, backend: u32, count: u32, size: u64) -> Option<&'static str> {
    if backend != BACKEND_CUDA {
        return None;
    }
    let layout = pool_layout(seg, backend, count, size)?;
    // SAFETY: the layout's CUDA info block, inside a mapping of the layout's size; atomics
    // only.
    let info = unsafe { seg.at::<CudaPoolInfo>(layout.cuda_info).as_ref() };
    Some(match info.host_flags() {
        Ok(false) => "events",
        Ok(true) => "host flags",
        Err(_) => "corrupt",
    })
}

fn slot_counts(seg: &Segment, backend: u32, count: u32, size: u64) -> Option<SlotCounts> {
    let layout = pool_layout(seg, backend, count, size)?;
    let mut counts = SlotCounts::default();
    for i in 0..layout.slot_count {
        // SAFETY: record i of a layout whose size equals the mapping; atomics only.
        let r = unsafe { seg.at::<SlotRecord>(layout.records + i * size_of::<SlotRecord>()) };
        // SAFETY: as above.
        let word = unsafe { r.as_ref() }.state.load(Ordering::Relaxed);
        match crate::pool::phase(word) {
            Phase::Free => counts.free += 1,
            Phase::Leased => counts.leased += 1,
            Phase::Sent => counts.in_flight += 1,
            Phase::Held => counts.held += 1,
        }
    }
    Some(counts)
}

/// A segment `clean` removed (or, dry, would remove), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// Object name, without the leading `/`.
    pub name: String,
    /// Why: "left over", "orphaned pool", "N queued, nobody attached", ...
    pub why: String,
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
        let why = match (info.kind, info.version == crate::layout::LAYOUT_VERSION, info.queued) {
            (None, _, _) | (_, false, _) => "another layout version, not in use".to_owned(),
            _ if !info.initialized => "never initialised, not in use".to_owned(),
            (_, _, Some(0)) => "left over (nothing queued, not in use)".to_owned(),
            (_, _, Some(n)) if queued => format!("{n} queued, nobody attached"),
            (_, _, None) if queued => "unreadable positions, not in use".to_owned(),
            _ => continue,
        };
        if dry_run || remove_unused(&info.name, queued) {
            cleaned.push(Cleaned { name: info.name.clone(), why });
        }
    }
    let gone: Vec<String> = cleaned.iter().map(|c| c.name.clone()).collect();
    for info in all.iter().filter(|i| i.is_pool() && i.in_use == Some(false)) {
        let orphaned = !pool_has_channel(&info.name, &all)
            || owner_of(&info.name).is_some_and(|(c, _)| gone.iter().any(|g| g == c));
        if !orphaned {
            continue; // its channel keeps it (messages in it may name this pool)
        }
        let removal = if dry_run {
            Removal::Removed
        } else {
            Segment::remove_if_unattended(&info.name, |_| true).unwrap_or(Removal::InUse)
        };
        if removal == Removal::Removed {
            let why = "orphaned pool (the channel that made it is gone)".to_owned();
            cleaned.push(Cleaned { name: info.name.clone(), why });
        }
    }
    Ok(cleaned)
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
        let (Some(kind), crate::layout::LAYOUT_VERSION) = (kind, version) else {
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

    use crate::layout::{BACKEND_CUDA, BACKEND_HOST, CudaPoolInfo, PoolLayout, SegmentKind};
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
        // SAFETY: the layout's CUDA info block in a mapping of the layout's size.
        let info = unsafe { seg.at::<CudaPoolInfo>(layout.cuda_info).as_ref() };
        for (word, said) in
            [(0, "events"), (1, "host flags"), (2, "corrupt"), (u32::MAX, "corrupt")]
        {
            info.ordering.store(word, Ordering::Relaxed);
            assert_eq!(
                super::ready_signal(&opened, BACKEND_CUDA, count, size),
                Some(said),
                "{word}"
            );
        }
        assert_eq!(super::ready_signal(&opened, BACKEND_HOST, count, size), None);
        // A segment of another size than its parameters say is not read.
        assert_eq!(super::ready_signal(&opened, BACKEND_CUDA, count + 1, size), None);
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
