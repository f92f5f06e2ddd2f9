//! `inspect`: one segment's ring, waiters, roles, pools and slots, read from outside.

use std::time::Duration;

use super::{PoolState, SegmentKind, pid_alive, ring_base};
use crate::layout::{
    BACKEND_CUDA, BACKEND_HOST, ChannelView, Corrupted, PARTICIPANT_CONSUMER, PARTICIPANT_PRODUCER,
    POOL_NAME_BYTES, PoolEntry, PoolLayout, PoolView, RingView, SegmentHeader, entry_pid,
    entry_role, entry_serial, load_bytes, participant_of,
};
use crate::liveness::Role;
use crate::pool::Phase;
use crate::shm::{Segment, ShmError};
use crate::sync::Ordering;

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
    /// Broadcast rings: whether the producer never waits for readers (lagging); `None`
    /// for other rings.
    pub lagging: Option<bool>,
}

/// An entry of a ring's participant table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// Entry index.
    pub index: usize,
    /// Its role (`None`: a code this version does not know).
    pub role: Option<Role>,
    /// The pid it recorded.
    pub pid: u32,
    /// Whether its liveness lock is held.
    pub alive: bool,
    /// Broadcast rings: a reader's cursor (the next position it reads), while the readers
    /// mask counts it.
    pub cursor: Option<u64>,
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

/// Where a pool's slots live, as its table entry or header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotMemory {
    /// Host shared memory.
    Host,
    /// CUDA device memory.
    Cuda,
    /// A code this version does not know.
    Unknown(u32),
}

impl SlotMemory {
    fn of(code: u32) -> Self {
        match code {
            BACKEND_HOST => SlotMemory::Host,
            BACKEND_CUDA => SlotMemory::Cuda,
            other => SlotMemory::Unknown(other),
        }
    }
}

/// How a device pool's sender signals that a slot's writes are done, as its segment says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadySignal {
    /// Interprocess events (`GpuReady::Event`).
    Events,
    /// Host ready flags (`GpuReady::HostFlag`).
    HostFlags,
    /// A value that is neither.
    Corrupt,
}

/// A pool as the channel's table and the pool's own segment describe it.
#[derive(Debug, Clone)]
pub struct PoolReport {
    /// Table row.
    pub index: u32,
    /// Registration instance.
    pub instance: u32,
    /// Where its entry stands (a pool segment on its own: active, or closed once its sender
    /// left).
    pub state: PoolState,
    /// The sender's pid and whether it runs.
    pub owner: (u32, Option<bool>),
    /// What the pool's owner word says (the kernel marks it when the sending process
    /// dies; no pid involved): `Some(true)` died, `Some(false)` alive, `None` not watched
    /// (the sender left cleanly, or could not be watched) or the pool could not be opened.
    pub owner_died: Option<bool>,
    /// Pool segment name.
    pub name: String,
    /// Where its slots live.
    pub memory: SlotMemory,
    /// Slots.
    pub slot_count: u32,
    /// Bytes per slot.
    pub slot_size: u64,
    /// Slots by state (`None`: the pool segment could not be opened).
    pub slots: Option<SlotCounts>,
    /// Device pools: how the sender signals that a slot's writes are done. `None` for host
    /// pools, or when the segment could not be opened.
    pub ready: Option<ReadySignal>,
    /// Senders asleep waiting for a free slot of this pool (`None`: the segment could not
    /// be opened).
    pub waiting_senders: Option<u32>,
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
    /// Channels: what becomes of a message whose receiver dies holding it.
    pub delivery: Option<Delivery>,
}

/// A channel's delivery guarantee, as its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// `Some(true)`: such a message is delivered again to another receiver (marked);
    /// `Some(false)`: it is dropped and its slot taken back; `None`: the header holds
    /// neither (corrupt: the channel refuses to open).
    pub redeliver: Option<bool>,
    /// A sender found messages whose receiver died holding them, and no receiver has
    /// looked for them since (they go at the next receive).
    pub orphans_hinted: bool,
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
        delivery: None,
    };
    // The channel's layout, read once: its table size is shared memory, and a second read
    // could disagree with the first.
    let is_channel = kind.is_channel();
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
        SegmentKind::SpscRing | SegmentKind::MpmcRing | SegmentKind::BroadcastRing => {}
        SegmentKind::SpscChannel | SegmentKind::MpmcChannel | SegmentKind::BroadcastChannel => {
            let layout = channel.expect("a channel without a layout returned above");
            let table = ChannelView::with_layout(&seg, layout);
            let table = table.ok_or_else(|| corrupted("channel pool table beyond the segment"))?;
            // Relaxed: a snapshot.
            report.delivery = Some(Delivery {
                redeliver: match table.header.redeliver.load(Ordering::Relaxed) {
                    0 => Some(false),
                    1 => Some(true),
                    _ => None,
                },
                orphans_hinted: table.header.orphans.load(Ordering::Relaxed) != 0,
            });
            report.pools.extend((0u32..).zip(table.entries).filter_map(|(i, e)| pool_report(i, e)));
        }
        SegmentKind::HostPool | SegmentKind::CudaPool => {
            let p =
                crate::layout::view::<crate::layout::PoolHeader>(&seg, size_of::<SegmentHeader>())
                    .ok_or_else(|| corrupted("pool segment shorter than its header"))?;
            // Relaxed: a snapshot.
            let (count, size, backend) = (
                p.slot_count.load(Ordering::Relaxed),
                p.slot_size.load(Ordering::Relaxed),
                p.backend.load(Ordering::Relaxed),
            );
            let owner = p.owner_pid.load(Ordering::Relaxed);
            let owner_died = owner_word(p);
            let closed = p.closed.load(Ordering::Relaxed) == 1;
            let pool = PoolLayout::for_backend(backend, count, size)
                .and_then(|layout| Some((PoolView::of(&seg, &layout)?, layout)));
            report.pools.push(PoolReport {
                index: 0,
                instance: 0,
                state: if closed { PoolState::Closed } else { PoolState::Active },
                owner: (owner, pid_alive(owner)),
                owner_died,
                name: name.trim_start_matches('/').to_owned(),
                memory: SlotMemory::of(backend),
                slot_count: count,
                slot_size: size,
                slots: pool.map(|(p, _)| slot_counts(&p)),
                ready: pool.and_then(|(p, _)| ready_signal(&p)),
                waiting_senders: pool.and_then(|(_, l)| free_ring_sleepers(&seg, &l)),
            });
        }
    }
    Ok(report)
}

fn ring_state(seg: &Segment, base: usize, kind: SegmentKind) -> Result<RingState, ShmError> {
    let ring = RingView::at(seg, base)
        .ok_or(ShmError::Corrupted(Corrupted { what: "ring header beyond the segment" }))?;
    let (rh, c, table) = (ring.header, ring.control, ring.participants);
    let spsc = matches!(kind, SegmentKind::SpscRing | SegmentKind::SpscChannel);
    let broadcast = matches!(kind, SegmentKind::BroadcastRing | SegmentKind::BroadcastChannel);
    let mut participants = Vec::new();
    let mut serials = Vec::new();
    for (index, entry) in table.entries.iter().enumerate() {
        // Relaxed: a snapshot, checked against the lock.
        let value = entry.load(Ordering::Relaxed);
        if value == 0 {
            continue;
        }
        let role = match entry_role(value) {
            PARTICIPANT_PRODUCER => Some(Role::Producer),
            PARTICIPANT_CONSUMER => Some(Role::Consumer),
            _ => None,
        };
        let alive = seg
            .byte_held_elsewhere(1 + index as u64)
            .map_err(|source| ShmError::Io { op: "fcntl(F_OFD_GETLK)", source })?;
        let serial = entry_serial(value);
        // Relaxed: a snapshot.
        let counted = rh.readers.load(Ordering::Relaxed) & (1 << index) != 0;
        let cursor =
            (broadcast && counted).then(|| table.claims[index].pop.load(Ordering::Relaxed));
        participants.push(Participant { index, role, pid: entry_pid(value), alive, cursor });
        serials.push((index, serial));
    }
    // An SPSC role names its holder's identity: its entry and registration serial.
    let holder = |id: u32, role: Role| {
        let (index, serial) = participant_of(id).filter(|_| spsc)?;
        let p = participants
            .iter()
            .zip(&serials)
            .find(|(p, s)| p.index == index && p.role == Some(role) && **s == (index, serial));
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
        producer: holder(rh.producer_claim.load(Ordering::Relaxed), Role::Producer),
        consumer: holder(rh.consumer_claim.load(Ordering::Relaxed), Role::Consumer),
        participants,
        lagging: broadcast.then(|| rh.lagging.load(Ordering::Relaxed) != 0),
    })
}

/// A pool header's owner word: `Some(died)` when watched (see `PoolReport::owner_died`).
fn owner_word(p: &crate::layout::PoolHeader) -> Option<bool> {
    // Relaxed: a snapshot.
    match p.owner_word.load(Ordering::Relaxed) {
        0 => None,
        w => Some(w & crate::liveness::keeper::OWNER_DIED != 0),
    }
}

fn pool_report(index: u32, e: &PoolEntry) -> Option<PoolReport> {
    // Acquire: pairs with the Release store of the state by the registering sender.
    let state = match PoolEntry::code(e.state.load(Ordering::Acquire)) {
        PoolEntry::CLAIMED => PoolState::Registering,
        PoolEntry::ACTIVE => PoolState::Active,
        PoolEntry::CLOSED => PoolState::Closed,
        _ => return None,
    };
    // Relaxed: after the Acquire above.
    let len = (e.name_len.load(Ordering::Relaxed) as usize).min(POOL_NAME_BYTES);
    let mut bytes = [0u8; POOL_NAME_BYTES];
    load_bytes(&e.name, &mut bytes);
    let name = String::from_utf8_lossy(&bytes[..len]).into_owned();
    let (backend, count, size) = (
        e.backend.load(Ordering::Relaxed),
        e.slot_count.load(Ordering::Relaxed),
        e.slot_size.load(Ordering::Relaxed),
    );
    let owner = e.owner_pid.load(Ordering::Relaxed);
    let layout = PoolLayout::for_backend(backend, count, size);
    let seg = Segment::open_any(&name, Duration::ZERO).ok().map(|(seg, _)| seg);
    let pool = seg.as_ref().zip(layout).and_then(|(seg, l)| PoolView::of(seg, &l));
    Some(PoolReport {
        index,
        instance: e.instance.load(Ordering::Relaxed),
        state,
        owner: (owner, pid_alive(owner)),
        owner_died: seg.as_ref().and_then(|seg| {
            crate::layout::view::<crate::layout::PoolHeader>(seg, size_of::<SegmentHeader>())
                .and_then(owner_word)
        }),
        memory: SlotMemory::of(backend),
        slot_count: count,
        slot_size: size,
        slots: pool.as_ref().map(slot_counts),
        ready: pool.as_ref().and_then(ready_signal),
        waiting_senders: seg.as_ref().zip(layout).and_then(|(seg, l)| free_ring_sleepers(seg, &l)),
        name,
    })
}

/// A device pool's ready signal, as its [`CudaPoolInfo::ordering`] word says.
///
/// [`CudaPoolInfo::ordering`]: crate::layout::CudaPoolInfo
pub(super) fn ready_signal(pool: &PoolView<'_>) -> Option<ReadySignal> {
    Some(match pool.cuda_info?.host_flags() {
        Ok(false) => ReadySignal::Events,
        Ok(true) => ReadySignal::HostFlags,
        Err(_) => ReadySignal::Corrupt,
    })
}

/// The pool's slots by state (a snapshot).
fn slot_counts(pool: &PoolView<'_>) -> SlotCounts {
    let mut counts = SlotCounts::default();
    for r in pool.records {
        // Relaxed: a snapshot.
        match crate::pool::phase(r.state.load(Ordering::Relaxed)) {
            Phase::Free => counts.free += 1,
            Phase::Leased => counts.leased += 1,
            Phase::Sent => counts.in_flight += 1,
            Phase::Held => counts.held += 1,
        }
    }
    counts
}

/// Senders asleep on the free ring of the pool in `seg` (laid out as `layout`): waiting
/// for a slot to come back.
fn free_ring_sleepers(seg: &Segment, layout: &PoolLayout) -> Option<u32> {
    (seg.len() == layout.total_size).then_some(())?;
    Some(RingView::at(seg, layout.free_ring.ring_header)?.control.not_empty.sleepers())
}
