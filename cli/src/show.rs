//! `gpuring inspect`, `list` and `clean`: segments seen from outside.

use gpuring::inspect::{self, Inspection};

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
        say!(
            "waiters   {} receiver(s) asleep, {} sender(s) asleep",
            r.waiting_consumers,
            r.waiting_producers
        );
        if i.moving {
            say!("note      the ring moved while it was read: these figures are no snapshot");
        }
        for (role, who) in [("producer", r.producer), ("consumer", r.consumer)] {
            if let Some((pid, a)) = who {
                say!("{role:<9} pid {pid} ({})", alive(a));
            }
        }
        for p in &r.participants {
            say!(
                "attached  #{} {} pid {} ({})",
                p.index,
                p.role,
                p.pid,
                if p.alive { "alive" } else { "dead: its process died attached" }
            );
        }
    }
    #[cfg(feature = "cuda")]
    if i.pools.iter().any(|p| p.backend == gpuring::internal::BACKEND_CUDA)
        && crate::demo::gpu_present()
    {
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
                p.state.to_owned(),
                format!("{} ({})", p.owner.0, alive(p.owner.1)),
                if p.backend == 2 { "cuda" } else { "host" }.to_owned(),
                p.ready.unwrap_or("-").to_owned(),
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
            if s.initialized { s.state(&all) } else { "not initialised".to_owned() },
        ]);
    }
    say!("{t}");
    Ok(())
}

pub(crate) fn clean(dry_run: bool, queued: bool, prefix: &str) -> Result<(), Error> {
    let removed = inspect::clean(dry_run, queued, prefix)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for c in &removed {
        say!("{verb} {}: {}", c.name, c.why);
    }
    say!("{verb} {} segment(s) no process uses", removed.len());
    Ok(())
}
