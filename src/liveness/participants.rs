//! The participant table of a ring in shared memory, and what an endpoint holds there
//! ([`Attachment`]): its entry with the entry's liveness lock and, for SPSC, its role.

use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use super::{
    AttachError, ClaimLine, ClaimLock, Gone, PeerCount, ProcessState, Role, Watch, process_state,
};
use crate::layout::{
    Claims, Corrupted, MAX_PARTICIPANTS, PARTICIPANT_CONSUMER, PARTICIPANT_PRODUCER, ParticipantId,
    Participants, RingControl, RingHeader, entry_pid, entry_role, entry_serial, entry_value,
    participant_id, participant_of, side,
};
use crate::shm::Segment;
use crate::sync::{AtomicU32, Ordering};

fn lock_error(op: &'static str) -> impl FnOnce(io::Error) -> AttachError {
    move |source| AttachError::Io { op, source }
}

/// The participant table of the ring in one mapped segment, with its liveness locks.
#[derive(Debug)]
pub(crate) struct ParticipantTable {
    segment: Arc<Segment>,
    table: NonNull<Participants>,
    /// The ring header, whose registration counter gives each registration its serial.
    header: NonNull<RingHeader>,
    /// Entries this handle holds (bit `i`: entry `i`). Its locks are taken through
    /// `segment`'s descriptor, and a description never conflicts with itself, so this
    /// handle must neither take an entry it holds nor probe it.
    own: Mutex<u64>,
}

// SAFETY: a pointer into the mapping that `segment` keeps alive; the table is atomics only,
// and `own` is behind a mutex.
unsafe impl Send for ParticipantTable {}
// SAFETY: as above.
unsafe impl Sync for ParticipantTable {}

/// What a registration must settle before it reuses a dead endpoint's entry: given the
/// entry's claim line, and whether a live endpoint's line names a position of a side,
/// returns `false` to leave the entry alone (its claims are still needed as evidence).
pub(crate) type Settle<'a> = &'a dyn Fn(&Claims, &dyn Fn(Role, u64) -> bool) -> bool;

impl ParticipantTable {
    /// The table at `offset` in `segment`, of the ring whose header is at `header`.
    ///
    /// # Panics
    ///
    /// If either does not fit there (offsets come from a checked layout).
    pub(crate) fn new(segment: Arc<Segment>, header: usize, offset: usize) -> Arc<Self> {
        // SAFETY: `at` checks bounds and alignment; both are atomics only.
        let (table, header) =
            unsafe { (segment.at::<Participants>(offset), segment.at::<RingHeader>(header)) };
        Arc::new(Self { segment, table, header, own: Mutex::new(0) })
    }

    fn participants(&self) -> &Participants {
        // SAFETY: inside the mapping that `segment` keeps alive (checked in `new`); atomics
        // only, valid for any bytes.
        unsafe { self.table.as_ref() }
    }

    fn own(&self) -> u64 {
        *self.own.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an endpoint of `role`: takes a free entry (or a dead endpoint's, once
    /// `settle` has settled what its claims name) and holds its lock until the returned
    /// [`Participant`] drops.
    ///
    /// # Errors
    ///
    /// [`AttachError::TooManyParticipants`], [`AttachError::Io`].
    pub(crate) fn register(
        self: &Arc<Self>,
        role: Role,
        settle: Settle<'_>,
    ) -> Result<Participant, AttachError> {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = &self.participants().entries;
        // Free entries first, so that a dead endpoint's entry stays as evidence of its
        // death (its peers report `PeerDead` by it) until the table has no other room.
        let free_first = (0..MAX_PARTICIPANTS)
            // Relaxed: a hint for the order of tries; the lock decides.
            .filter(|&i| entries[i].load(Ordering::Relaxed) == 0)
            .chain((0..MAX_PARTICIPANTS).filter(|&i| entries[i].load(Ordering::Relaxed) != 0));
        for index in free_first {
            if *own & (1 << index) != 0 {
                continue;
            }
            // The lock first: holding it makes the entry ours, whatever it says (a free
            // entry, or a dead endpoint's).
            let byte = 1 + index as u64;
            if self.segment.lock_byte(byte).map_err(lock_error("fcntl(F_OFD_SETLK)"))? {
                let claims = &self.participants().claims[index];
                // A dead endpoint's claims are the only evidence of cells it won and never
                // finished: settle them before they are overwritten, or leave the entry.
                let own_now = *own;
                let live_names = |role, pos| self.names(role, pos, own_now, None).1;
                if !settle(claims, &live_names) {
                    self.segment.unlock_byte(byte);
                    continue;
                }
                // Relaxed: the entry is ours; nobody reads these until we win a position.
                claims.push.store(0, Ordering::Relaxed);
                claims.pop.store(0, Ordering::Relaxed);
                *own |= 1 << index;
                // SAFETY: inside the mapping that `segment` keeps alive (checked in `new`);
                // atomics only.
                let header = unsafe { self.header.as_ref() };
                // Relaxed: a counter; only that serials differ matters.
                let serial = header.registrations.fetch_add(1, Ordering::Relaxed);
                // Relaxed: the entry is a claim that readers check against the lock (a
                // syscall on both sides), not a publication of other data.
                entries[index].store(entry_value(role.code(), serial, pid), Ordering::Relaxed);
                let id = participant_id(index, serial);
                return Ok(Participant { table: self.clone(), index, id });
            }
        }
        Err(AttachError::TooManyParticipants { max: MAX_PARTICIPANTS as u32 })
    }

    /// Entry `index` checked against its liveness lock: `None` when free, else its value
    /// and whether its holder lives. Entries this handle holds (`own`) live; another's
    /// lives while some description holds its byte and its process (the pid it recorded)
    /// has not begun to exit; one whose lock is gone and whose value is unchanged after
    /// that was seen is dead (a leaving endpoint clears its entry before it unlocks). One
    /// `F_OFD_GETLK` per entry not ours, and a read of `/proc/<pid>/stat` per one held.
    ///
    /// A process that has begun to exit runs no more of its own code, but keeps its locks
    /// until the kernel has closed its files, which comes after its memory is unmapped: a
    /// GPU process SIGKILLed inside a receive took up to 10 s there on an H200 VM, with
    /// every MPMC endpoint waiting for the cell it held. So it counts as dead at once.
    /// (What a dead GPU holder's device work may still touch waits for its exit all the
    /// same: `Backend::holder_gone`.)
    fn probe(&self, index: usize, own: u64) -> io::Result<Option<(u64, bool)>> {
        let entry = &self.participants().entries[index];
        // Relaxed: a claim, checked against the lock.
        let value = entry.load(Ordering::Relaxed);
        if value == 0 {
            return Ok(None);
        }
        if own & (1 << index) != 0 {
            return Ok(Some((value, true)));
        }
        if self.segment.byte_held_elsewhere(1 + index as u64)? {
            let exiting = process_state(entry_pid(value)) == ProcessState::Exiting;
            return Ok(Some((value, !exiting)));
        }
        // Relaxed: as above.
        Ok((entry.load(Ordering::Relaxed) == value).then_some((value, false)))
    }

    /// Runs `f` holding entry `index`'s liveness lock, if no endpoint holds it (its
    /// endpoint died, or left) and this handle does not: no endpoint can register there
    /// while `f` runs. Whether `f` ran. One or two `fcntl` calls: slow paths only.
    pub(crate) fn while_unheld(&self, index: usize, f: impl FnOnce()) -> bool {
        let own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        if index >= MAX_PARTICIPANTS || *own & (1 << index) != 0 {
            return false;
        }
        let byte = 1 + index as u64;
        if !self.segment.lock_byte(byte).unwrap_or(false) {
            return false;
        }
        f();
        self.segment.unlock_byte(byte);
        true
    }

    /// The cursor line of entry `index` of a broadcast ring (its claims' `pop` word: see
    /// `RingHeader::readers`).
    pub(crate) fn cursor(&self, index: usize) -> &crate::sync::AtomicU64 {
        &self.participants().claims[index].pop
    }

    /// Live and dead endpoints of `role`. A handful of syscalls: for blocked endpoints and
    /// tools only.
    pub(crate) fn peers(&self, role: Role) -> io::Result<PeerCount> {
        let (code, own) = (role.code(), self.own());
        let mut count = PeerCount::default();
        for index in 0..MAX_PARTICIPANTS {
            // Relaxed: a claim; only entries of `role` are probed (a lock probe, and the
            // holder's `/proc` state, each), and the probe reads the entry again.
            if entry_role(self.participants().entries[index].load(Ordering::Relaxed)) != code {
                continue;
            }
            match self.probe(index, own)? {
                Some((value, true)) if entry_role(value) == code => count.live += 1,
                Some((value, false)) if entry_role(value) == code => count.dead += 1,
                _ => {}
            }
        }
        Ok(count)
    }

    /// Whether some entry whose value names no endpoint of either role (0, or a value a
    /// scribbler wrote) is locked by another description: an endpoint that lives although
    /// its entry no longer says so. Asked before concluding that a side has gone, so that
    /// a scribbled entry cannot make a live endpoint invisible. One `F_OFD_GETLK` per such
    /// entry: the confirming path only.
    pub(crate) fn unnamed_holder(&self) -> bool {
        let own = self.own();
        let known = [PARTICIPANT_PRODUCER, PARTICIPANT_CONSUMER].map(u64::from);
        (0..MAX_PARTICIPANTS).any(|index| {
            // Relaxed: a claim, checked against the lock.
            let value = self.participants().entries[index].load(Ordering::Relaxed);
            own & (1 << index) == 0
                && !known.contains(&u64::from(entry_role(value)))
                && self.segment.byte_held_elsewhere(1 + index as u64).unwrap_or(true)
        })
    }

    /// Whether the endpoint that `id` names is gone: `None` while it holds its entry (one
    /// of this handle's own included); `Some(Some(pid))` when it died holding it (the pid
    /// it recorded); `Some(None)` when its entry was cleared or registered again since (it
    /// left, or died and its entry was reused), or `id` names no entry. Never by pid: a
    /// new endpoint whose pid equals the dead one's has another identity. One
    /// `F_OFD_GETLK`; a probe that fails counts as alive (waiting on is the safe answer).
    pub(crate) fn id_gone(&self, id: ParticipantId) -> Option<Option<u32>> {
        let Some((index, serial)) = participant_of(id) else {
            return Some(None);
        };
        match self.probe(index, self.own()) {
            Ok(Some((value, live))) if entry_serial(value) == serial => {
                (!live).then_some(Some(entry_pid(value)))
            }
            Ok(_) => Some(None),
            Err(_) => None,
        }
    }

    /// The pid recorded by the registration `id` names, if its entry still holds it
    /// (reports only).
    fn pid_of(&self, id: ParticipantId) -> u32 {
        participant_of(id)
            .map(|(index, serial)| {
                // Relaxed: a report.
                let value = self.participants().entries[index].load(Ordering::Relaxed);
                if entry_serial(value) == serial { entry_pid(value) } else { 0 }
            })
            .unwrap_or(0)
    }

    /// Whether the claim lines of `role`'s side name position `pos`: (some dead endpoint's
    /// does, some live one's does). An entry whose probe fails counts as live (leaving a
    /// cell alone is the safe answer). Callers read the position counter with Acquire
    /// first: a live winner stores its claim before its winning CAS, so its line then names
    /// the cell until it has finished it (see `ClaimLine`).
    fn names(&self, role: Role, pos: u64, own: u64, skip: Option<usize>) -> (bool, bool) {
        let (mut dead, mut live) = (false, false);
        for (i, line) in self.participants().claims.iter().enumerate() {
            if Some(i) == skip {
                continue;
            }
            let word = match role {
                Role::Producer => &line.push,
                Role::Consumer => &line.pop,
            };
            // Relaxed: ordered after the caller's Acquire load of the position counter
            // (see above); the probe that follows reads the lock.
            if Claims::names(word.load(Ordering::Relaxed), pos) {
                match self.probe(i, own) {
                    Ok(Some((_, false))) => dead = true,
                    Ok(None) => {}
                    _ => live = true,
                }
            }
        }
        (dead, live)
    }

    /// Whether an unfinished cell at MPMC position `pos` on `role`'s side is a dead
    /// endpoint's: a dead endpoint's line names it and no live one's does (see `names`).
    pub(crate) fn orphaned(&self, role: Role, pos: u64) -> bool {
        matches!(self.names(role, pos, self.own(), None), (true, false))
    }

    /// As [`orphaned`](Self::orphaned) for the consumer side, leaving out line `mine` (an
    /// adopter's own, which names the cell while it adopts: see `repair::adopt_cell`).
    pub(crate) fn orphaned_but(&self, mine: usize, pos: u64) -> bool {
        matches!(self.names(Role::Consumer, pos, self.own(), Some(mine)), (true, false))
    }
}

/// An entry of the participant table, held (with its liveness lock) for the life of an
/// endpoint.
#[derive(Debug)]
pub(crate) struct Participant {
    table: Arc<ParticipantTable>,
    index: usize,
    /// Its identity: entry and registration serial.
    id: ParticipantId,
}

impl Drop for Participant {
    fn drop(&mut self) {
        if self.table.segment.inherited() {
            // A forked child's copy: the entry and its lock (on the description the parent
            // shares) stay the parent's.
            return;
        }
        let mut own = self.table.own.lock().unwrap_or_else(PoisonError::into_inner);
        let participants = self.table.participants();
        // Every claim of a leaving endpoint is finished. Relaxed: as the entry below.
        let claims = &participants.claims[self.index];
        claims.push.store(0, Ordering::Relaxed);
        claims.pop.store(0, Ordering::Relaxed);
        // Cleared before the lock goes, so a prober that finds the lock gone and then the
        // entry unchanged knows that the holder died rather than left. Relaxed: as in
        // `register`; the unlock syscall below orders it for other processes.
        participants.entries[self.index].store(0, Ordering::Relaxed);
        self.table.segment.unlock_byte(1 + self.index as u64);
        *own &= !(1 << self.index);
    }
}

/// The parts of a ring's segment an attachment reads and writes besides its entry: the
/// ring header (SPSC role claims, attach counts) and the control block (wait words, to wake
/// the other side when leaving).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingParts {
    /// The ring header.
    pub(crate) header: NonNull<RingHeader>,
    /// The control block.
    pub(crate) control: NonNull<RingControl>,
}

/// How an endpoint attaches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttachAs {
    /// Its side.
    pub(crate) role: Role,
    /// SPSC: claim the role in the ring header (one endpoint per side).
    pub(crate) spsc: bool,
    /// Count itself in the attach counts, so that the other side sees its departure
    /// (named rings and channel rings; not a pool's free ring, whose producers are the
    /// receivers that happened to map the pool).
    pub(crate) counted: bool,
    /// A sole endpoint: never cloned, used by one thread at a time, so its claim turns
    /// take no lock (see `ClaimLock`).
    pub(crate) sole: bool,
}

/// What an endpoint holds in a ring's segment: its participant entry and, for SPSC, its
/// role; and, when it is counted, its place in the attach count of its side. It is also
/// what the endpoint's storage answers liveness questions with ([`Watch`]).
#[derive(Debug)]
pub struct Attachment {
    how: AttachAs,
    ring: RingParts,
    /// The entry's claim line, inside the mapping (read on every MPMC push and pop).
    claims: NonNull<Claims>,
    /// Makes the clones of this endpoint take turns with its claim line.
    claim_lock: ClaimLock,
    /// `None` only inside `drop`, which gives the entry back before the count.
    participant: Option<Participant>,
    /// Keeps the mapping while `drop` runs after the entry is given back.
    table: Arc<ParticipantTable>,
    /// Whether this endpoint holds its SPSC role, and is in its side's attach count: what
    /// `drop` gives back (a failed attach has neither).
    holds_role: bool,
    in_count: bool,
    /// The segment's close count when this endpoint's last probe found its peers alive and
    /// nothing to do (`u64::MAX`: none yet; see [`Watch::closes`]).
    clear_at: std::sync::atomic::AtomicU64,
}

// SAFETY: pointers into the mapping that `table` keeps alive; atomics only.
unsafe impl Send for Attachment {}
// SAFETY: as above.
unsafe impl Sync for Attachment {}

impl Attachment {
    /// Registers an endpoint in `table` (see [`ParticipantTable::register`]) as `how`
    /// says: for SPSC, also claims the role, taking it over from a dead holder; when
    /// counted, adds itself to its side's attach count.
    ///
    /// # Errors
    ///
    /// [`AttachError::RoleTaken`] while another holder of the role lives, and what
    /// registering returns.
    pub(crate) fn take(
        table: &Arc<ParticipantTable>,
        how: AttachAs,
        ring: RingParts,
        settle: Settle<'_>,
    ) -> Result<Self, AttachError> {
        let participant = table.register(how.role, settle)?;
        // The watch of the segment's closes, now rather than at the first long wait, which
        // may come in a steady state that allocates nothing (`Watch::closes`).
        if how.counted && !cfg!(miri) {
            table.segment.closes();
        }
        let claims = NonNull::from(&table.participants().claims[participant.index]);
        let mut attachment = Self {
            how,
            ring,
            claims,
            claim_lock: if how.sole { ClaimLock::sole() } else { ClaimLock::new() },
            participant: Some(participant),
            table: table.clone(),
            holds_role: false,
            in_count: false,
            clear_at: std::sync::atomic::AtomicU64::new(u64::MAX),
        };
        if how.spsc {
            attachment.claim_role()?; // on error, `drop` gives the entry back
            attachment.holds_role = true;
        }
        if how.counted {
            let header = attachment.header();
            let side = side(how.role.code());
            // Release: publishes this endpoint's registered entry (stored above, after its
            // lock) to `gone`, which reads `joined` (Acquire) before it scans the entries.
            header.joined[side].store(1, Ordering::Release);
            // Relaxed: the count is a hint that the other side confirms with the locks;
            // a reader that sees it go up learns nothing from it (only a Release
            // decrement, in `drop`, publishes anything).
            header.attached[side].fetch_add(1, Ordering::Relaxed);
            attachment.in_count = true;
        }
        Ok(attachment)
    }

    /// Whether this is a sole endpoint (see [`AttachAs::sole`]).
    pub(crate) fn is_sole(&self) -> bool {
        self.claim_lock.is_sole()
    }

    /// This endpoint's entry in the participant table (`None` once it gave it back).
    pub(crate) fn participant_index(&self) -> Option<usize> {
        self.participant.as_ref().map(|p| p.index)
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: the ring header lies inside the mapping that `table` keeps alive; atomics
        // only.
        unsafe { self.ring.header.as_ref() }
    }

    fn role_word(&self) -> &AtomicU32 {
        let header = self.header();
        match self.how.role {
            Role::Producer => &header.producer_claim,
            Role::Consumer => &header.consumer_claim,
        }
    }

    /// Claims the SPSC role with a CAS of 0 → this endpoint's identity, taking it over
    /// from a holder that is gone (by its entry and lock, never by pid).
    fn claim_role(&self) -> Result<(), AttachError> {
        let word = self.role_word();
        let me = Watch::id(self).unwrap_or(0);
        let mut expected = 0;
        loop {
            // Acquire on success: pairs with the Release store in `drop` of the previous
            // holder (or the Relaxed-then-death of a dead one, whose last positions we
            // re-read from the control block anyway), so its last writes are visible.
            match word.compare_exchange(expected, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(0) => expected = 0,
                Err(holder) if self.table.id_gone(holder).is_none() => {
                    let holder_pid = self.table.pid_of(holder);
                    return Err(AttachError::RoleTaken { role: self.how.role, holder_pid });
                }
                Err(holder) => expected = holder, // gone: take the role over
            }
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if self.table.segment.inherited() {
            return; // a forked child's copy: role and count stay the parent's
        }
        if self.holds_role {
            // Release: pairs with the Acquire CAS in `claim_role` of the next holder.
            self.role_word().store(0, Ordering::Release);
        }
        // The entry goes first (cleared, then unlocked), so that a peer which sees the
        // count below drop finds no live entry when it asks the locks, and never takes a
        // departure for a death.
        drop(self.participant.take());
        if self.in_count {
            let side = side(self.how.role.code());
            // Release: pairs with the Acquire load in `maybe_left`: a peer that sees the
            // count drop sees everything this endpoint published before leaving. Never
            // below 0 (a forged count stays forged, and the locks decide).
            let _ = self.header().attached[side].fetch_update(
                Ordering::Release,
                Ordering::Relaxed,
                |n| n.checked_sub(1),
            );
            // SAFETY: the control block lies inside the mapping that `table` keeps alive;
            // atomics only.
            let control = unsafe { self.ring.control.as_ref() };
            // Fenced: a broadcast ring's receivers register without the heavy barrier.
            crate::wait::notify_fenced(&control.not_empty);
            crate::wait::notify_fenced(&control.not_full);
        }
    }
}

impl Watch for Attachment {
    const WATCHES: bool = true;
    fn gone(&self, role: Role) -> Option<Gone> {
        // Read before the scan. Acquire: pairs with the Release store in `take`, so that
        // an endpoint that has joined is in the scan below. (Read after it, an endpoint
        // registering during the scan, missed by it, could be taken for one that left.)
        let joined = self.header().joined[side(role.code())].load(Ordering::Acquire) != 0;
        // A probe that fails (it cannot, for an open descriptor) counts as "alive": waiting
        // on is the safe answer.
        let peers = self.table.peers(role).ok()?;
        if peers.live > 0 || self.table.unnamed_holder() {
            return None;
        }
        if peers.dead > 0 {
            return Some(Gone::Died);
        }
        (self.how.counted && joined).then_some(Gone::Left)
    }
    #[inline(always)]
    fn maybe_left(&self, role: Role) -> bool {
        if !self.how.counted {
            return false;
        }
        let header = self.header();
        let side = side(role.code());
        // Acquire: pairs with the Release decrement in `drop` (see there). Relaxed for
        // `joined`: read after it, set before any count.
        header.attached[side].load(Ordering::Acquire) == 0
            && header.joined[side].load(Ordering::Relaxed) != 0
    }
    fn closes(&self) -> Option<(&std::sync::atomic::AtomicU32, &std::sync::atomic::AtomicU64)> {
        // Message rings only: a pool's free ring (not counted) is waited on by a sender
        // for slots, which can come back later than a holder's close (a GPU context lives
        // until its process has exited), so it keeps the 30 ms tick. No inotify, no futex
        // under Miri.
        if !self.how.counted || cfg!(miri) {
            return None;
        }
        Some((self.table.segment.closes().word()?, &self.clear_at))
    }
    fn damaged(&self) -> Option<Corrupted> {
        self.table.segment.truncated().then_some(Corrupted {
            what: "segment truncated by another process (pages past its end now read as zeros)",
        })
    }
    #[inline(always)]
    fn claims(&self) -> Option<ClaimLine<'_>> {
        // SAFETY: the entry's claim line, inside the mapping the table keeps alive; atomics
        // only.
        let line = unsafe { self.claims.as_ref() };
        Some(ClaimLine { line, lock: &self.claim_lock })
    }
    fn orphaned(&self, role: Role, pos: u64) -> bool {
        self.table.orphaned(role, pos)
    }
    fn orphaned_but_mine(&self, pos: u64) -> bool {
        // An endpoint that is not registered has no line of its own (and adopts nothing).
        self.participant.as_ref().is_some_and(|p| self.table.orphaned_but(p.index, pos))
    }
    fn id(&self) -> Option<ParticipantId> {
        self.participant.as_ref().map(|p| p.id)
    }
    fn id_gone(&self, id: ParticipantId) -> Option<Option<u32>> {
        self.table.id_gone(id)
    }
}
