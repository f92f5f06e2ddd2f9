//! A channel's segment as this process sees it ([`ChannelSegment`]: its checked
//! parameters and descriptor ring), and the pool table inside it: senders register their
//! pools there, receivers look them up.
//!
//! **Pool table and names.** A sender claims an empty entry (or a closed one whose pool is
//! gone) with a CAS to `CLAIMED`, creates its pool segment named
//! `{channel}.{nonce}.p{index}.{instance}`, fills the entry, then stores `ACTIVE` with
//! Release. The instance (a channel-wide counter) and the creator's nonce keep names unique
//! across entry reuse and across channels re-created under one name. Pool ids in
//! descriptors are `instance << 16 | index`. A receiver never opens a name a peer wrote:
//! it derives the name and checks that the entry says the same.

use std::sync::Arc;
use std::time::Duration;

use super::Flavor;
use super::backend::sealed::Backend;
use super::error::{ChannelError, PoolError, RecvTimeoutError, corrupt};
use crate::layout::{
    ChannelHeader, ChannelLayout, ChannelView, LAYOUT_VERSION, POOL_NAME_BYTES, ParticipantId,
    PoolEntry, SegmentKind, load_bytes, store_bytes, view,
};
use crate::pool::{PoolSegment, PoolSegmentError};
use crate::ring::RingSegment;
use crate::shm::{Segment, ShmError, object_name};
use crate::sync::Ordering;

/// Longest channel name: pool segment names append a suffix of up to 35 bytes.
pub const MAX_CHANNEL_NAME: usize = 200;

/// Where a pool table entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolState {
    /// A sender is registering it.
    Registering,
    /// Its sender is live.
    Active,
    /// Its sender is gone; slots still in flight drain back to it.
    Closed,
}

/// A row of the pool table, as [`Channel::pools`](crate::Channel::pools) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Table index (low 16 bits of a descriptor's `pool_id`).
    pub index: u32,
    /// Registration instance (high 16 bits of `pool_id`).
    pub instance: u32,
    /// Where the entry stands.
    pub state: PoolState,
    /// The sending process, as it registered (pids are reused).
    pub owner_pid: u32,
    /// The pool segment's name, without the leading `/` ([`Sender::pool_name`](crate::Sender::pool_name)
    /// has it).
    pub name: String,
}

/// A pool a sender registered: where it sits in the table, and what it made.
pub(super) struct Registered<B: Backend> {
    pub(super) index: u32,
    pub(super) instance: u32,
    pub(super) pool: PoolSegment,
    pub(super) made: B::Made,
}

/// A channel segment, created or opened, with its parameters read once and checked.
#[derive(Debug)]
pub(crate) struct ChannelSegment<B: Backend> {
    pub(super) segment: Arc<Segment>,
    pub(super) layout: ChannelLayout,
    pub(super) flavor: Flavor,
    pub(super) ring: Arc<RingSegment>,
    pub(super) slot_count: u32,
    pub(super) slot_size: u64,
    pub(super) nonce: u32,
    /// Whether messages whose receiver died holding them are delivered again (the
    /// header's `redeliver`, read once).
    pub(super) redeliver: bool,
    /// The channel name without its leading `/`: the stem of its pools' names.
    pub(super) base: String,
    pub(super) open_timeout: Duration,
    pub(super) ctx: B::Context,
}

impl<B: Backend> ChannelSegment<B> {
    /// The header and the table, as the checked layout places them.
    fn view(&self) -> ChannelView<'_> {
        ChannelView::with_layout(&*self.segment, self.layout)
            .expect("the layout was checked against the mapping at create or open")
    }

    fn header(&self) -> &ChannelHeader {
        self.view().header
    }

    fn entry(&self, index: u32) -> &PoolEntry {
        self.view().entry(index)
    }

    pub(super) fn max_pools(&self) -> u32 {
        self.layout.max_pools as u32
    }

    /// The pool segment name for table entry `index`, registration `instance`: derived,
    /// so a receiver never opens a name a peer chose.
    fn pool_name(&self, index: u32, instance: u32) -> String {
        pool_name(&self.base, self.nonce, index, instance)
    }

    /// Claims a table entry for the sender `me` (its identity in the channel's ring) and
    /// makes its pool of `slots` (count, bytes each: the channel's, or the sender's own)
    /// through the backend under the entry's name, recording them in the entry; the entry
    /// goes `ACTIVE` once the pool exists. First, entries of senders that died are closed
    /// ([`close_dead_owners`](Self::close_dead_owners)); and when no entry is free, closed
    /// entries whose pools only dead receivers keep are drained
    /// ([`drain_closed`](Self::drain_closed)). `queued(pool_id, slot, generation)` says
    /// whether a descriptor naming that slot is still in the channel's ring.
    ///
    /// # Errors
    ///
    /// [`ChannelError::PoolTableFull`], and what making the pool returns.
    pub(super) fn register_pool(
        &self,
        me: ParticipantId,
        queued: &dyn Fn(u32, u32, u32) -> bool,
        slots: (u32, u64),
    ) -> Result<Registered<B>, ChannelError<B>> {
        self.close_dead_owners(me, queued);
        if let Some(registered) = self.claim(me, slots)? {
            return Ok(registered);
        }
        if self.drain_closed(queued) > 0 {
            if let Some(registered) = self.claim(me, slots)? {
                return Ok(registered);
            }
        }
        Err(ChannelError::PoolTableFull { max_pools: self.max_pools() })
    }

    /// Claims an entry that is empty, or closed with its pool gone, and makes the pool
    /// there; `None` when there is no such entry.
    fn claim(
        &self,
        me: ParticipantId,
        (slot_count, slot_size): (u32, u64),
    ) -> Result<Option<Registered<B>>, ChannelError<B>> {
        for index in 0..self.max_pools() {
            let entry = self.entry(index);
            // Acquire: pairs with the Release store of the state by the entry's last
            // writer, so its instance and name are visible.
            let state = entry.state.load(Ordering::Acquire);
            let reusable = match PoolEntry::code(state) {
                PoolEntry::EMPTY => true,
                // Reusable once its pool is drained: the last one out unlinked it.
                PoolEntry::CLOSED => {
                    !Segment::exists(&self.pool_name(index, self.instance(entry)))?
                }
                _ => false,
            };
            // Acquire: as above; makes this sender the entry's only writer.
            if !reusable
                || entry
                    .state
                    .compare_exchange(
                        state,
                        PoolEntry::state(PoolEntry::CLAIMED, me),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_err()
            {
                continue;
            }
            // Relaxed: a counter; only uniqueness matters.
            let instance =
                self.header().registrations.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
                    & 0xFFFF;
            // Before the pool exists, so that if this sender dies making it, whoever closes
            // the entry finds the pool by its name. Relaxed: read by that closer after its
            // Acquire CAS of the state, which a dead claimer never published: it reads
            // either this instance or the entry's previous one, whose pool is gone (checked
            // above, and names are never made twice).
            entry.instance.store(instance, Ordering::Relaxed);
            let name = self.pool_name(index, instance);
            let (pool, made) = match B::create_pool(&self.ctx, &name, slot_count, slot_size) {
                Ok(made) => made,
                Err(e) => {
                    // Release: pairs with the Acquire loads above. (The instance written
                    // names no pool: the entry is as reusable as it was.)
                    entry.state.store(state, Ordering::Release);
                    return Err(e.into());
                }
            };
            // A death here leaves the entry CLAIMED by a sender that is gone, and a pool
            // that nobody saw: `close_dead_owners` removes both.
            crate::fault::point("pool_made");
            // Relaxed: published by the Release store of `state` below.
            entry.backend.store(B::CODE, Ordering::Relaxed);
            entry.slot_count.store(slot_count, Ordering::Relaxed);
            entry.slot_size.store(slot_size, Ordering::Relaxed);
            entry.owner_pid.store(std::process::id(), Ordering::Relaxed);
            write_name(entry, &name);
            // Release: pairs with the Acquire load of the state in `open_pool`; the fields
            // above are visible to a receiver that sees ACTIVE.
            entry.state.store(PoolEntry::state(PoolEntry::ACTIVE, me), Ordering::Release);
            return Ok(Some(Registered { index, instance, pool, made }));
        }
        Ok(None)
    }

    /// Closes the entries of senders that died: those whose owner (see [`PoolEntry`]) is
    /// gone. One that died registering left a `CLAIMED` entry and perhaps a pool nobody ever
    /// saw, which is removed. One that died after that left an `ACTIVE` entry, whose pool is
    /// closed as its sender would have closed it, the slots that would never come back
    /// marked free first (`PoolSegment::close_orphaned`); it unlinks itself once the
    /// messages still queued are received and given back. Each entry is taken first (a CAS
    /// to its code by `me`), so that of several registering senders one closes it, and a
    /// taker that dies halfway leaves it to the next one. One lock probe per owned entry.
    pub(super) fn close_dead_owners(
        &self,
        me: ParticipantId,
        queued: &dyn Fn(u32, u32, u32) -> bool,
    ) {
        self.close_dead_owners_but(me, queued, &|_, _| None);
    }

    /// [`close_dead_owners`](Self::close_dead_owners), without the lock probe of the
    /// entries whose owner `owner(index, instance)` knows about (a receiver that has the
    /// pool mapped reads its owner word: one load, where a probe is a few syscalls):
    /// `Some(true)`, it lives (left alone); `Some(false)`, the kernel marked the word at its
    /// death (closed). The mark is the death itself, where the owner's lock can outlive
    /// it: a process's locks go with its open file descriptions, which its mappings hold
    /// until the kernel lets go of its memory, and a GPU driver tearing down a dead
    /// process's registered host memory can hold that after the process is reaped (a GPU
    /// test saw a killed sender's entry live to the probe after its messages had been
    /// refused).
    pub(super) fn close_dead_owners_but(
        &self,
        me: ParticipantId,
        queued: &dyn Fn(u32, u32, u32) -> bool,
        owner: &dyn Fn(u32, u32) -> Option<bool>,
    ) {
        for index in 0..self.max_pools() {
            let entry = self.entry(index);
            // Acquire: pairs with the Release store of the state by the entry's last
            // writer (its instance is visible).
            let state = entry.state.load(Ordering::Acquire);
            let code = PoolEntry::code(state);
            if !matches!(code, PoolEntry::CLAIMED | PoolEntry::ACTIVE)
                || PoolEntry::owner(state) == me
            {
                continue;
            }
            let known =
                if code == PoolEntry::ACTIVE { owner(index, self.instance(entry)) } else { None };
            let dead = match known {
                Some(alive) => !alive,
                None => self.ring.id_gone(PoolEntry::owner(state)).is_some(),
            };
            if !dead {
                continue;
            }
            // Acquire: as above; makes this sender the one that closes the entry.
            let taken = entry.state.compare_exchange(
                state,
                PoolEntry::state(code, me),
                Ordering::Acquire,
                Ordering::Relaxed,
            );
            if taken.is_err() {
                continue;
            }
            let instance = self.instance(entry);
            if code == PoolEntry::CLAIMED {
                // Never published: nobody else has it open.
                let name = self.pool_name(index, instance);
                let _ = Segment::remove_if_unattended(&name, |_| true);
            } else {
                // A pool that cannot be opened (damaged, or its free ring's participant table
                // full) stays until the channel goes; the entry is closed all the same.
                drop(self.close_pool(index, instance, true, queued, self.redeliver));
            }
            // Release: pairs with the Acquire loads of the state in `claim`.
            entry.state.store(PoolEntry::CLOSED, Ordering::Release);
        }
    }

    /// Drains the closed entries whose pools are still there because receivers that died
    /// hold their slots (a sender that left while a receiver held one, then that receiver
    /// died): those slots are marked free and the pool unlinks itself. Returns how many
    /// pools that removed. Maps each closed pool still there: for a full table only.
    fn drain_closed(&self, queued: &dyn Fn(u32, u32, u32) -> bool) -> u32 {
        let mut drained = 0;
        for index in 0..self.max_pools() {
            let entry = self.entry(index);
            // Acquire: pairs with the Release store of the state by the entry's last writer.
            if PoolEntry::code(entry.state.load(Ordering::Acquire)) != PoolEntry::CLOSED {
                continue;
            }
            let instance = self.instance(entry);
            // Room first: a message a dead receiver held here is dropped, even where the
            // channel delivers again (a table this full has no better way to make room).
            let closed = self.close_pool(index, instance, false, queued, false);
            let gone = !Segment::exists(&self.pool_name(index, instance)).unwrap_or(true);
            drained += u32::from(closed.is_ok() && gone);
        }
        drained
    }

    /// `PoolSegment::close_orphaned` for the pool at entry `index`, registration
    /// `instance`, whose sender died (`sender_dead`) or left; with `redeliver`, the
    /// messages of dead receivers stay for a receiver to take over.
    fn close_pool(
        &self,
        index: u32,
        instance: u32,
        sender_dead: bool,
        queued: &dyn Fn(u32, u32, u32) -> bool,
        redeliver: bool,
    ) -> Result<(), PoolSegmentError> {
        let pool_id = instance << 16 | index;
        PoolSegment::close_orphaned(
            &self.pool_name(index, instance),
            B::CODE,
            self.entry_slots(index),
            sender_dead,
            B::holder_gone,
            |slot, generation| queued(pool_id, slot, generation),
            redeliver,
        )
    }

    /// Notes, for every receiver's next receive, that a message whose receiver died holding
    /// it waits to be delivered again (`ChannelHeader::orphans`).
    pub(super) fn note_orphans(&self) {
        // Relaxed: a hint; the receiver that acts on it acquires the slot by its own CAS.
        self.header().orphans.store(1, Ordering::Relaxed);
    }

    /// Whether `note_orphans` was called since the last `take_orphans_hint`: one load.
    #[inline]
    pub(super) fn orphans_hinted(&self) -> bool {
        // The header alone (not the whole view): this is on every receive.
        let header = view::<ChannelHeader>(&*self.segment, self.layout.header);
        // Relaxed: as in `note_orphans`.
        header.expect("checked at create or open").orphans.load(Ordering::Relaxed) != 0
    }

    /// Clears the hint, before a look for such messages (a hint set after is seen again).
    pub(super) fn clear_orphans_hint(&self) {
        // Relaxed: as in `note_orphans`.
        self.header().orphans.store(0, Ordering::Relaxed);
    }

    /// The slots (count, bytes each) entry `index` records for its pool, read after an
    /// Acquire load of its state: untrusted, as all of the table (the pool's layout checks
    /// them, and its segment must agree).
    fn entry_slots(&self, index: u32) -> (u32, u64) {
        let entry = self.entry(index);
        // Relaxed: after the caller's Acquire load of the state.
        (entry.slot_count.load(Ordering::Relaxed), entry.slot_size.load(Ordering::Relaxed))
    }

    /// The registration instance an entry records (16 bits), read after an Acquire load of
    /// its state.
    fn instance(&self, entry: &PoolEntry) -> u32 {
        // Relaxed: after the caller's Acquire load of the state.
        entry.instance.load(Ordering::Relaxed) & 0xFFFF
    }

    /// A sender is gone: its entry is closed (its pool drains back and unlinks itself).
    pub(super) fn close_entry(&self, index: u32) {
        // Release: pairs with the Acquire loads of the state in `register_pool`.
        self.entry(index).state.store(PoolEntry::CLOSED, Ordering::Release);
    }

    /// Maps the pool at table row `index`, registration `instance`, for a receiver that
    /// sees it for the first time, after checking the entry against the channel; with
    /// `wait`, waits up to the open timeout for its segment to be ready (a receiver that
    /// got a descriptor of it), else not at all (a look for messages to deliver again,
    /// which finds a closed pool already gone).
    ///
    /// # Errors
    ///
    /// `Corrupted` for an entry that is not that pool, or a pool that is gone; `Pool` when
    /// mapping it fails.
    pub(super) fn open_pool(
        &self,
        index: u32,
        instance: u32,
        wait: bool,
    ) -> Result<PoolSegment, RecvTimeoutError<B>> {
        let entry = self.entry(index);
        // Acquire: pairs with the Release store of ACTIVE in `register_pool`.
        let state = entry.state.load(Ordering::Acquire);
        // Relaxed: after the Acquire above.
        if !matches!(PoolEntry::code(state), PoolEntry::ACTIVE | PoolEntry::CLOSED)
            || entry.instance.load(Ordering::Relaxed) != instance
        {
            return Err(corrupt("descriptor names an unknown pool"));
        }
        // Each sender's pool has the slots its entry records (the channel's, or its own):
        // impossible ones, or a segment that disagrees, are refused when it is opened.
        let (slot_count, slot_size) = self.entry_slots(index);
        if entry.backend.load(Ordering::Relaxed) != B::CODE {
            return Err(corrupt("pool table entry disagrees with the channel"));
        }
        let name = self.pool_name(index, instance);
        if read_name(entry) != name {
            return Err(corrupt("pool table entry names an unexpected segment"));
        }
        let timeout = if wait { self.open_timeout } else { Duration::ZERO };
        let opened = PoolSegment::open(&name, B::CODE, slot_count, slot_size, timeout);
        opened.map_err(|e| match e {
            PoolSegmentError::Segment(ShmError::NotFound { .. }) => {
                corrupt("descriptor names a pool that no longer exists")
            }
            PoolSegmentError::Segment(ShmError::Corrupted(c)) | PoolSegmentError::Corrupted(c) => {
                RecvTimeoutError::Corrupted(c)
            }
            // The entry's slots (untrusted) size a mapping its segment does not have.
            PoolSegmentError::Segment(ShmError::SizeMismatch { .. }) => {
                corrupt("pool table entry disagrees with its pool segment")
            }
            PoolSegmentError::Segment(e) => RecvTimeoutError::Pool(PoolError::Segment(e)),
            PoolSegmentError::Attach(e) => RecvTimeoutError::Pool(PoolError::Attach(e)),
        })
    }

    /// The row and instance of every entry whose pool may hold messages (active or
    /// closed), without allocating: for receivers' looks for messages to deliver again.
    pub(super) fn pools_in_use(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..self.max_pools()).filter_map(|index| {
            let e = self.entry(index);
            // Acquire: pairs with the Release store of the state in `register_pool`.
            let code = PoolEntry::code(e.state.load(Ordering::Acquire));
            matches!(code, PoolEntry::ACTIVE | PoolEntry::CLOSED).then(|| (index, self.instance(e)))
        })
    }

    /// The pool table's entries in use (a snapshot, for diagnostics).
    pub(super) fn pools(&self) -> Vec<PoolInfo> {
        (0..self.max_pools())
            .filter_map(|index| {
                let e = self.entry(index);
                // Acquire: pairs with the Release store of the state in `register_pool`.
                let state = match PoolEntry::code(e.state.load(Ordering::Acquire)) {
                    PoolEntry::CLAIMED => PoolState::Registering,
                    PoolEntry::ACTIVE => PoolState::Active,
                    PoolEntry::CLOSED => PoolState::Closed,
                    _ => return None,
                };
                Some(PoolInfo {
                    index,
                    // Relaxed: after the Acquire above.
                    instance: e.instance.load(Ordering::Relaxed),
                    state,
                    owner_pid: e.owner_pid.load(Ordering::Relaxed),
                    name: read_name(e),
                })
            })
            .collect()
    }
}

/// The name of the pool at table row `index`, registration `instance`, of the channel
/// named `base` (without its `/`) whose creator drew `nonce`.
pub(crate) fn pool_name(base: &str, nonce: u32, index: u32, instance: u32) -> String {
    format!("{base}.{nonce:08x}.p{index}.{instance}")
}

/// What the last user out of a channel asks (see `shm::LastOut`): the channel may go once
/// its ring is empty; then every pool its table names goes first (pools that their
/// senders' protocol already removed are gone; those a crash left, or whose slots a
/// killed receiver held, are removed here), also one still mapped somewhere (a message
/// kept past its channel). Names are derived from the table's indices and instances,
/// never read from it.
pub(crate) fn last_out(
    seg: &Segment,
    layout: &ChannelLayout,
    base: &str,
    nonce: u32,
    broadcast: bool,
) -> bool {
    // A broadcast channel keeps nothing for a receiver that comes later.
    if !broadcast && !RingSegment::drained_in(seg, &layout.ring) {
        return false;
    }
    remove_pools(seg, layout, base, nonce);
    true
}

/// Removes the name of every pool that the table of channel `seg` names: for the channel's
/// last user out, and tools removing a channel nobody has open. Whoever still maps such a
/// pool (a message kept past its channel) keeps reading it: only the name goes, and nothing
/// opens a pool by name without its channel (whose name, carrying this instance's nonce,
/// is going too). Skipping pools still open left one in `/dev/shm` for good when its
/// sender had died (nobody closed it, so its last slot back did not unlink it).
pub(crate) fn remove_pools(seg: &Segment, layout: &ChannelLayout, base: &str, nonce: u32) {
    let Some(view) = ChannelView::with_layout(seg, *layout) else { return };
    for (index, entry) in (0u32..).zip(view.entries) {
        // Acquire: pairs with the Release store of the state in `register_pool`.
        if entry.state.load(Ordering::Acquire) == PoolEntry::EMPTY {
            continue;
        }
        // Relaxed: after the Acquire above.
        let instance = entry.instance.load(Ordering::Relaxed) & 0xFFFF;
        let _ = Segment::unlink(&pool_name(base, nonce, index, instance));
    }
}

/// A channel segment's layout (with a one-cell ring: the ring's offsets do not depend on
/// its capacity) and nonce, from its header, checked against the mapping: for tools and
/// removals that look at a segment without opening it as a channel.
pub(crate) fn channel_layout(seg: &Segment) -> Option<(ChannelLayout, u32)> {
    let view = ChannelView::read(seg)?;
    // Relaxed: a snapshot of a value the creator published before `init`.
    Some((view.layout, view.header.nonce.load(Ordering::Relaxed)))
}

/// Removes the pools of channel segment `seg` (named `name`) that nobody has open: the
/// names carry that channel's nonce, so they are its pools and no other instance's.
pub(crate) fn remove_pools_of(seg: &Segment, name: &str) {
    if let Some((layout, nonce)) = channel_layout(seg) {
        remove_pools(seg, &layout, name.trim_start_matches('/'), nonce);
    }
}

/// `replace_stale`: removes channel `name` if nobody has it open, and with it the pools of
/// that instance (whose names carry its nonce, so no later channel of the name would ever
/// look at them again). A segment that is not a channel of this version goes alone.
pub(crate) fn remove_stale(name: &str) -> Result<(), ShmError> {
    Segment::remove_if_unattended(name, |seg| {
        let header = seg.header();
        // Relaxed: values the creator published before `init`; a snapshot.
        let kind = SegmentKind::from_raw(header.kind.load(Ordering::Relaxed));
        let version = header.version.load(Ordering::Relaxed);
        if version == LAYOUT_VERSION && kind.is_some_and(SegmentKind::is_channel) {
            remove_pools_of(seg, name);
        }
        true
    })
    .map(drop)
}

/// Packs `name` into an entry's name words.
fn write_name(entry: &PoolEntry, name: &str) {
    assert!(name.len() <= POOL_NAME_BYTES, "pool names are bounded by MAX_CHANNEL_NAME");
    store_bytes(&entry.name, name.as_bytes());
    // Relaxed: published by the Release store of `state`.
    entry.name_len.store(name.len() as u32, Ordering::Relaxed);
}

/// Reads an entry's name (lossy: it is shared memory).
fn read_name(entry: &PoolEntry) -> String {
    // Relaxed: read after the caller's Acquire load of `state`.
    let len = (entry.name_len.load(Ordering::Relaxed) as usize).min(POOL_NAME_BYTES);
    let mut bytes = [0u8; POOL_NAME_BYTES];
    load_bytes(&entry.name, &mut bytes);
    String::from_utf8_lossy(&bytes[..len]).into_owned()
}

/// The channel name without its leading `/`, checked.
pub(super) fn check_name(name: &str) -> Result<String, ShmError> {
    let full = object_name(name)?;
    let bare = full.to_str().expect("object names are UTF-8")[1..].to_owned();
    if bare.len() > MAX_CHANNEL_NAME {
        return Err(ShmError::InvalidName {
            name: name.to_owned(),
            reason: "longer than 200 bytes (pool segment names add a suffix)",
        });
    }
    Ok(bare)
}

/// A number that differs between channels created one after another under one name.
pub(super) fn nonce() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let x = t ^ (u64::from(std::process::id()) << 32);
    // A 64-to-32 mix (splitmix64's finaliser) so nearby times give unrelated values.
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) as u32
}
