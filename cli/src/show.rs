//! `gpuring inspect`, `list` and `clean`: segments seen from outside.

use gpuring::Role;
use gpuring::inspect::{
    self, CleanReason, Inspection, PoolState, ReadySignal, SegmentState, SlotMemory,
};

use crate::{Error, bytes, say, table};

pub(crate) fn inspect(name: &str) -> Result<(), Error> {
    inspect::inspect(name).map_err(Error::from).map(print_inspection)
}

fn alive(a: Option<bool>) -> &'static str {
    match a {
        Some(true) => "alive",
        Some(false) => "dead",
        None => "-",
    }
}

fn print_inspection(i: Inspection) {
    say!("segment   {} ({:?}, {} bytes)", i.name, i.kind, i.size);
    let use_ = match i.in_use {
        Some(true) => "in use",
        Some(false) => "open in no process",
        None => "-",
    };
    say!("creator   pid {} (diagnostic only); {use_}", i.creator_pid);
    if let Some(r) = &i.ring {
        say!(
            "ring      capacity {}, element {} bytes, head {}, tail {}, depth {}",
            r.capacity,
            r.elem_size,
            r.head,
            r.tail,
            r.depth()
        );
        let senders_for_slots: u32 = i.pools.iter().filter_map(|p| p.waiting_senders).sum();
        let (consumers, producers) =
            if i.pools.is_empty() { ("consumer", "producer") } else { ("receiver", "sender") };
        say!(
            "asleep    {} waiting for {}; {} waiting for room in the ring{}",
            count(r.waiting_consumers, consumers, &format!("{consumers}s")),
            if i.pools.is_empty() { "an element" } else { "a message" },
            count(r.waiting_producers, producers, &format!("{producers}s")),
            if i.pools.is_empty() {
                String::new()
            } else {
                format!(", {} for a free slot", count(senders_for_slots, "sender", "senders"))
            }
        );
        if i.moving {
            say!("note      the ring moved while it was read: these figures are no snapshot");
        }
        match r.lagging {
            Some(true) => say!(
                "policy    lagging: the producer never waits; a reader it overtook is told \
                 how many it missed"
            ),
            Some(false) => say!("policy    the slowest reader holds the producer back"),
            None => {}
        }
        for (role, who) in [("producer", r.producer), ("consumer", r.consumer)] {
            if let Some((pid, a)) = who {
                say!("{role:<9} pid {pid} ({})", alive(a));
            }
        }
        for p in &r.participants {
            say!(
                "attached  #{} {} pid {} ({}){}",
                p.index,
                match (p.role, p.cursor.is_some()) {
                    (Some(Role::Consumer), true) => "reader",
                    (Some(Role::Producer), _) => "producer",
                    (Some(Role::Consumer), false) => "consumer",
                    (None, _) => "unknown role",
                },
                p.pid,
                if p.alive { "alive" } else { "dead: its process died attached" },
                p.cursor.map_or(String::new(), |c| format!(
                    ", at {c}: {} behind",
                    r.tail.wrapping_sub(c).min(r.capacity)
                ))
            );
        }
    }
    if let Some(d) = i.delivery {
        say!(
            "delivery  {}{}",
            match d.redeliver {
                Some(true) => "a message whose receiver dies holding it goes to another receiver",
                Some(false) => "a message whose receiver dies holding it is dropped",
                None => "corrupt (neither redelivery nor not): the channel refuses to open",
            },
            if d.orphans_hinted { "; some are waiting for the next receive" } else { "" }
        );
    }
    #[cfg(feature = "cuda")]
    if i.pools.iter().any(|p| p.memory == SlotMemory::Cuda) && crate::demo::gpu_present() {
        for line in crate::gpu_demo::machine_lines() {
            say!("{line}");
        }
    }
    if !i.pools.is_empty() {
        let mut t = table(
            "pool | state | owner | backend | ready by | slots | slot size | free | leased \
             | in flight | held | segment",
        );
        for p in &i.pools {
            let counts = |f: fn(&inspect::SlotCounts) -> u32| {
                p.slots.as_ref().map_or("?".to_owned(), |c| f(c).to_string())
            };
            t.add_row([
                format!("{}.{}", p.index, p.instance),
                match p.state {
                    PoolState::Registering => "registering",
                    PoolState::Active => "active",
                    PoolState::Closed => "closed",
                }
                .to_owned(),
                format!("{} ({})", p.owner.0, alive(p.owner.1)),
                match p.memory {
                    SlotMemory::Host => "host".to_owned(),
                    SlotMemory::Cuda => "cuda".to_owned(),
                    SlotMemory::Unknown(code) => format!("unknown ({code})"),
                    _ => "?".to_owned(),
                },
                match p.ready {
                    Some(ReadySignal::Events) => "events",
                    Some(ReadySignal::HostFlags) => "host flags",
                    Some(ReadySignal::Corrupt) => "corrupt",
                    _ => "-",
                }
                .to_owned(),
                p.slot_count.to_string(),
                bytes(p.slot_size),
                counts(|c| c.free),
                counts(|c| c.leased),
                counts(|c| c.in_flight),
                counts(|c| c.held),
                p.name.clone(),
            ]);
        }
        say!("{t}");
    }
}

pub(crate) fn list() -> Result<(), Error> {
    let all = inspect::list()?;
    if all.is_empty() {
        say!("no gpuring segments in /dev/shm");
        return Ok(());
    }
    let mut t = table("name | kind | size | age | creator pid | state");
    for s in &all {
        t.add_row([
            s.name.clone(),
            s.kind.map_or("unknown".to_owned(), |k| format!("{k:?}")),
            bytes(s.size),
            s.age.map_or("-".to_owned(), |a| format!("{}s", a.as_secs())),
            s.creator_pid.to_string(),
            state(s.state(&all)) + &s.readers.as_ref().map_or(String::new(), |r| readers(r)),
        ]);
    }
    say!("{t}");
    Ok(())
}

pub(crate) fn clean(dry_run: bool, queued: bool, prefix: &str) -> Result<(), Error> {
    let removed = inspect::clean(dry_run, queued, prefix)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for c in &removed {
        say!("{verb} {}: {}", c.name, reason(c.why));
    }
    say!("{verb} {} no process uses", count(removed.len() as u32, "segment", "segments"));
    // What stays, and why: a clean that removed nothing must not leave the user guessing.
    let all = inspect::list()?;
    let gone = |name: &str| removed.iter().any(|c| c.name == name);
    let prefix = prefix.trim_start_matches('/');
    let left = all.iter().filter(|i| i.name.starts_with(prefix) && !i.is_pool() && !gone(&i.name));
    for info in left {
        match info.state(&all) {
            SegmentState::Waiting { queued: n } => say!(
                "left {}: {} waiting for a consumer, nobody attached (`gpuring clean --queued {}` \
                 drops them)",
                info.name,
                count(n as u32, "element", "elements"),
                info.name
            ),
            SegmentState::InUse => say!("left {}: in use", info.name),
            _ => {}
        }
    }
    Ok(())
}

/// A broadcast segment's readers for `list`: how many, and how far the slowest is behind.
fn readers(behind: &[u64]) -> String {
    let slowest = behind.iter().max().map_or(String::new(), |m| format!(", slowest {m} behind"));
    format!("; {}{slowest}", count(behind.len() as u32, "reader", "readers"))
}

/// `n` and the noun that goes with it.
fn count(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn state(s: SegmentState) -> String {
    match s {
        SegmentState::NotInitialized => "not initialised".to_owned(),
        SegmentState::InUse => "in use".to_owned(),
        SegmentState::Unknown => "unknown".to_owned(),
        SegmentState::PoolOfChannel => "pool of a channel".to_owned(),
        SegmentState::OrphanedPool => "orphaned pool".to_owned(),
        SegmentState::Waiting { queued } => format!("waiting: {queued} queued"),
        SegmentState::LeftOver => "left over".to_owned(),
        _ => "?".to_owned(),
    }
}

fn reason(why: CleanReason) -> String {
    match why {
        CleanReason::OtherVersion => "another layout version, not in use".to_owned(),
        CleanReason::NeverInitialized => "never initialised, not in use".to_owned(),
        CleanReason::LeftOver => "left over (nothing queued, not in use)".to_owned(),
        CleanReason::Queued(n) => format!("{n} queued, nobody attached"),
        CleanReason::UnreadablePositions => "unreadable positions, not in use".to_owned(),
        CleanReason::OrphanedPool => "orphaned pool (the channel that made it is gone)".to_owned(),
        _ => "?".to_owned(),
    }
}
