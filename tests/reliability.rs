//! Reliability, round two: what an unlucky day finds. Each test is one finding of an
//! independent suite (real processes, SIGKILL), written to fail before its fix.
#![cfg(not(loom))] // processes and shared memory are not modelled by loom

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use common::{Deliveries, Peer, die, ring_name, role, unique_name};
use gpuring::{Channel, PoolState, TensorMeta};

const LIMIT: Duration = Duration::from_secs(20);

/// Makes object `name` in /dev/shm (mode 0600, as gpuring's are) holding `image`: a
/// segment copied or left as another process would have.
fn write_object(name: &str, image: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(format!("/dev/shm/{name}"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, image, 0).unwrap();
}

/// A new sender of `ch` that has sent one message tagged `tag`.
fn send_one(ch: &Channel, tag: u64) -> gpuring::Sender {
    let tx = ch.sender().unwrap();
    let mut lease = tx.acquire_timeout(LIMIT).unwrap();
    lease[..8].copy_from_slice(&tag.to_le_bytes());
    lease.set_tag(tag);
    tx.send(lease, TensorMeta::bytes(8)).unwrap();
    tx
}

/// `replace_stale` after the creator crashed takes the dead instance's pools with its
/// channel; and a pool of an earlier instance that is still there (put back here by hand, as
/// a process killed between removing a channel and its pools would leave it) is an orphan
/// that `clean` removes while the new channel of the same name lives, which keeps its own
/// pools.
#[test]
fn replace_stale_then_clean_leaves_nothing_of_the_old_instance() {
    if role().as_deref() == Some("creator") {
        let ch = Channel::builder(ring_name()).slots(2, 64).create().unwrap();
        let _tx = send_one(&ch, 1);
        die();
    }
    let name = unique_name("stale");
    let mut creator = Peer::spawn(
        "replace_stale_then_clean_leaves_nothing_of_the_old_instance",
        "creator",
        &name,
    );
    creator.died();
    let old = common::leftovers_of(&name);
    assert_eq!(old.len(), 2, "the dead instance's channel and pool: {old:?}");
    let old_pool = old.iter().find(|n| **n != name).unwrap().clone();
    let image = std::fs::read(format!("/dev/shm/{old_pool}")).unwrap();

    let ch = Channel::builder(&name).slots(2, 64).replace_stale(true).create().unwrap();
    assert_eq!(
        common::leftovers_of(&name),
        std::slice::from_ref(&name),
        "replace_stale took the old pool along"
    );
    let _tx = send_one(&ch, 2);
    let live = common::leftovers_of(&name);
    assert_eq!(live.len(), 2, "the new channel and its pool: {live:?}");

    // An old instance's pool that outlived the replacement.
    write_object(&old_pool, &image);
    let all = gpuring::inspect::list().unwrap();
    let info = all.iter().find(|i| i.name == old_pool).unwrap();
    assert_eq!(info.state(&all), gpuring::inspect::SegmentState::OrphanedPool);
    let cleaned = gpuring::inspect::clean(false, false, &name).unwrap();
    let names: Vec<&str> = cleaned.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [old_pool.as_str()], "clean removed the old pool and nothing else");
    assert_eq!(common::leftovers_of(&name), live, "the live channel and its pool stay");
    let rx = ch.receiver().unwrap();
    assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), 2);
}

/// A role whose dead holder had the claimant's pid: a copy of a ring whose roles this very
/// process holds (in the copy nobody holds their locks: the holders are dead, and their
/// pid is ours, as after pid reuse or in another pid namespace). The copy's roles are
/// taken over; the original's stay ours. Before, a pid comparison found our own fresh
/// entry and refused with `RoleTaken` naming our pid.
#[test]
fn a_role_whose_dead_holder_had_our_pid_is_taken_over() {
    use gpuring::{AttachError, SpscRing};
    let name = unique_name("pid-reuse");
    let ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    let (mut tx, mut rx) = (ring.producer().unwrap(), ring.consumer().unwrap());
    tx.try_push(7).unwrap();
    let image = std::fs::read(format!("/dev/shm/{name}")).unwrap();
    let copy = unique_name("pid-reuse-copy");
    write_object(&copy, &image);
    let copied = SpscRing::<u64>::builder(&copy).open().unwrap();
    let mut rx2 = copied.consumer().expect("the copy's dead consumer (our pid) is taken over");
    let _tx2 = copied.producer().expect("the copy's dead producer (our pid) is taken over");
    assert_eq!(rx2.try_pop(), Ok(7), "what the copy holds");
    let me = std::process::id();
    assert!(matches!(
        ring.consumer(),
        Err(AttachError::RoleTaken { holder_pid, .. }) if holder_pid == me
    ));
    assert_eq!(rx.try_pop(), Ok(7), "the original's element, still there");
}

/// A slot held by a crashed receiver while 100 more receivers crash (each maps the pool,
/// so the pool's 64-entry participant table fills with dead entries and they are reused,
/// the crashed holder's among them), and then a live receiver takes that very entry. The
/// sender still gets the slot back: the holder is named by entry and registration serial,
/// and that registration is gone. Before, the holder was an entry index, which the live
/// receiver now held: the slot was lost for good.
#[test]
fn a_slot_of_a_crashed_receiver_comes_back_after_100_more_crashes() {
    use gpuring::Receiver;
    const TEST: &str = "a_slot_of_a_crashed_receiver_comes_back_after_100_more_crashes";
    let tag_of = |m: &gpuring::Message| u64::from_le_bytes(m[..8].try_into().unwrap());
    match role().as_deref() {
        Some("holder") => {
            let ch = Channel::builder(ring_name()).open().unwrap();
            let rx: Receiver = ch.receiver().unwrap();
            let m = rx.recv_timeout(LIMIT).unwrap();
            common::announce(&format!("holding {}", tag_of(&m)));
            die();
        }
        Some("crasher") => {
            let ch = Channel::builder(ring_name()).open().unwrap();
            let rx: Receiver = ch.receiver().unwrap();
            drop(rx.recv_timeout(LIMIT).unwrap()); // maps the pool, gives the slot back
            die();
        }
        _ => {}
    }
    const SLOTS: usize = 4;
    let name = unique_name("holders");
    // Without redelivery: the held slot comes back to the sender (with it, the first
    // crasher would take the held message over: `tests/liveness.rs`).
    let b = Channel::builder(&name).capacity(16).slots(SLOTS as u32, 64).redeliver(false);
    let ch = b.mpmc().create().unwrap();
    let tx = ch.sender().unwrap();
    let send = |tag: u64| {
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        lease[..8].copy_from_slice(&tag.to_le_bytes());
        tx.send(lease, TensorMeta::bytes(8)).unwrap();
    };
    send(0);
    let mut holder = Peer::spawn(TEST, "holder", &name);
    assert_eq!(holder.expect("holding"), "0");
    holder.died();
    for tag in 1..=100 {
        send(tag);
        Peer::spawn(TEST, "crasher", &name).died();
    }
    // A live receiver: it maps the pool and takes the lowest dead entry, the holder's.
    let rx = ch.receiver().unwrap();
    send(101);
    assert_eq!(tag_of(&rx.recv_timeout(LIMIT).unwrap()), 101);
    let t = std::time::Instant::now();
    let leases: Vec<_> =
        (0..SLOTS).map(|_| tx.acquire_timeout(Duration::from_secs(5)).unwrap()).collect();
    println!("every slot back in {:?}", t.elapsed());
    drop(leases);
    assert_eq!(tx.free_slots(), SLOTS);
    let pools = gpuring::inspect::inspect(&name).unwrap().pools;
    let held = pools.iter().filter_map(|p| p.slots.as_ref().map(|s| s.held)).sum::<u32>();
    assert_eq!(held, 0, "inspect shows no slot held");
}

/// Senders that crash one after another, three times as many as the pool table holds,
/// each with a message queued and a slot leased: every replacement registers, the queued
/// messages all arrive, and each dead sender's pool goes once its messages are taken.
/// Before, a crashed sender's entry stayed `Active` for good: the replacement after
/// `max_senders` crashes got `PoolTableFull`, and the pools stayed in /dev/shm.
fn crashed_senders_leave_the_pool_table_free(test: &str, mpmc: bool, max_senders: u32) {
    let tag_of = |m: &gpuring::Message| u64::from_le_bytes(m[..8].try_into().unwrap());
    if role().as_deref() == Some("victim") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tag: u64 = std::env::var("GPURING_TEST_TAG").unwrap().parse().unwrap();
        let tx = send_one(&ch, tag);
        let _leased = tx.acquire_timeout(LIMIT).unwrap();
        die();
    }
    let name = unique_name("crashed-senders");
    let mut builder = Channel::builder(&name).capacity(8).slots(4, 64).max_senders(max_senders);
    if mpmc {
        builder = builder.mpmc();
    }
    let ch = builder.create().unwrap();
    let rx = ch.receiver().unwrap();
    let crashes = u64::from(3 * max_senders);
    for tag in 0..crashes {
        let env = [("GPURING_TEST_TAG", tag.to_string())];
        Peer::spawn_with(test, "victim", &name, &env).died();
        // The previous victim's message, taken after this one closed its pool: the last
        // slot back unlinks it.
        if let Some(previous) = tag.checked_sub(1) {
            assert_eq!(tag_of(&rx.recv_timeout(LIMIT).unwrap()), previous);
        }
        let found = common::leftovers_of(&name);
        assert!(found.len() <= 2, "the channel and the last victim's pool only: {found:?}");
    }
    let tx = send_one(&ch, crashes);
    assert_eq!(tag_of(&rx.recv_timeout(LIMIT).unwrap()), crashes - 1, "the last victim's");
    assert_eq!(tag_of(&rx.recv_timeout(LIMIT).unwrap()), crashes, "the live sender's");
    let own = tx.pool_name().trim_start_matches('/').to_owned();
    assert_eq!(common::leftovers_of(&name), [name.clone(), own], "no dead sender's pool is left");
    let active: Vec<_> = ch.pools().into_iter().filter(|p| p.state != PoolState::Closed).collect();
    assert_eq!(active.len(), 1, "only the live sender's entry is active: {active:?}");
}

#[test]
fn crashed_spsc_senders_leave_the_pool_table_free() {
    crashed_senders_leave_the_pool_table_free(
        "crashed_spsc_senders_leave_the_pool_table_free",
        false,
        4,
    );
}

#[test]
fn crashed_mpmc_senders_leave_the_pool_table_free() {
    crashed_senders_leave_the_pool_table_free(
        "crashed_mpmc_senders_leave_the_pool_table_free",
        true,
        2,
    );
}

/// A sender that left cleanly while a receiver held one of its slots, then that receiver
/// crashed: the pool can never drain by itself. A sender registering in the full table
/// (one entry) gives the dead receiver's slot back, the old pool goes, and the entry is
/// taken. Before, the entry stayed closed with its pool there: `PoolTableFull` for good.
/// (The held message is dropped, redelivery or not: a full table makes room first.)
#[test]
fn a_pool_kept_only_by_a_dead_receiver_gives_its_entry_back() {
    if role().as_deref() == Some("holder") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let rx = ch.receiver().unwrap();
        let m = rx.recv_timeout(LIMIT).unwrap();
        common::announce(&format!("holding {}", m.tag()));
        die();
    }
    let name = unique_name("kept-pool");
    let ch = Channel::builder(&name).capacity(8).slots(2, 64).max_senders(1).create().unwrap();
    let tx = send_one(&ch, 1);
    let old_pool = tx.pool_name().trim_start_matches('/').to_owned();
    let mut holder =
        Peer::spawn("a_pool_kept_only_by_a_dead_receiver_gives_its_entry_back", "holder", &name);
    assert_eq!(holder.expect("holding"), "1");
    drop(tx); // leaves cleanly; the held slot keeps its pool
    holder.died();
    assert!(common::leftovers_of(&name).contains(&old_pool), "the pool waits for its held slot");
    let tx = send_one(&ch, 2);
    assert!(!common::leftovers_of(&name).contains(&old_pool), "the dead receiver's slot came back");
    let rx = ch.receiver().unwrap();
    assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), 2);
    drop(tx);
}

/// A sender crashed after its message was received, and the receiver is the last user
/// of the channel: when it leaves, the channel goes and the dead sender's pool with it.
/// Before, the receiver let go of the channel before its own mapping of that pool, so the
/// last-out removal saw the pool still open (by the receiver itself) and left it for
/// good. (Found by the Python package's tests, whose fixture checks /dev/shm.) Now the
/// receiver closes the dead sender's pool as it takes the message, so the pool goes with
/// the message, before the receiver leaves.
#[test]
fn the_last_receiver_out_removes_a_dead_senders_pool() {
    if role().as_deref() == Some("victim") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let _tx = send_one(&ch, 7);
        die();
    }
    let name = unique_name("last-receiver");
    let ch = Channel::builder(&name).capacity(8).slots(2, 64).create().unwrap();
    let rx = ch.receiver().unwrap();
    drop(ch); // the receiver alone holds the channel now
    Peer::spawn("the_last_receiver_out_removes_a_dead_senders_pool", "victim", &name).died();
    assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), 7);
    assert!(matches!(rx.recv_timeout(LIMIT), Err(gpuring::RecvTimeoutError::PeerDead)));
    assert_eq!(
        common::leftovers_of(&name),
        std::slice::from_ref(&name),
        "the dead sender's pool went with its message"
    );
    drop(rx);
    assert_eq!(
        common::leftovers_of(&name),
        Vec::<String>::new(),
        "the last one out took the channel"
    );
}

/// The numpy-view case of the Python package in Rust terms: a message kept after its
/// receiver and channel are dropped, its sender killed. The channel's last one out removes
/// the pool's name although this process still maps it (the message reads on); nothing is
/// left once the message goes. Before, the pool stayed in `/dev/shm` for good: the last one
/// out skipped it (open here), and the slot coming back did not unlink a pool that no live
/// sender had closed.
#[test]
fn a_message_kept_past_its_channel_leaves_nothing_once_its_sender_was_killed() {
    if role().as_deref() == Some("victim") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let _tx = send_one(&ch, 9);
        die();
    }
    let name = unique_name("kept-past");
    let ch = Channel::builder(&name).capacity(8).slots(2, 64).create().unwrap();
    let rx = ch.receiver().unwrap();
    Peer::spawn(
        "a_message_kept_past_its_channel_leaves_nothing_once_its_sender_was_killed",
        "victim",
        &name,
    )
    .died();
    let msg = rx.recv_timeout(LIMIT).unwrap();
    drop(rx);
    drop(ch);
    assert_eq!(common::leftovers_of(&name), Vec::<String>::new(), "the channel and its pool went");
    assert_eq!(msg.tag(), 9);
    assert_eq!(msg[..8], 9u64.to_le_bytes(), "the message still reads");
    drop(msg);
    assert_eq!(common::leftovers_of(&name), Vec::<String>::new());
}

/// A sender of the test's channel that has sent three messages, tagged 1 to 3 (a peer
/// about to die with them queued).
fn send_three() -> gpuring::Sender {
    let ch = Channel::builder(ring_name()).open().unwrap();
    let tx = ch.sender().unwrap();
    for tag in 1..=3u64 {
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        lease.set_tag(tag);
        tx.send(lease, TensorMeta::bytes(8)).unwrap();
    }
    tx
}

/// What `inspect` says of the pools' owner words: the kernel marked the killed sender's.
fn owner_died(name: &str) -> Vec<Option<bool>> {
    gpuring::inspect::inspect(name).unwrap().pools.iter().map(|p| p.owner_died).collect()
}

/// A sender killed with messages queued, and no sender registering after it: the receiver
/// gets them (host memory outlives its sender), and the dead sender's pool goes from
/// `/dev/shm` once they are received, while the channel lives on (SPSC and MPMC). The
/// kernel marks the pool's owner word at the death (`inspect` shows it; a live sender's
/// says alive, a cleanly departed one's is cleared). Before, the pool stayed until a
/// sender registered or the channel went.
#[test]
fn a_dead_senders_pool_goes_once_its_messages_are_received() {
    if role().as_deref() == Some("victim") {
        let _tx = send_three();
        die();
    }
    for mpmc in [false, true] {
        let name = unique_name(if mpmc { "dead-pool-mpmc" } else { "dead-pool-spsc" });
        let builder = Channel::builder(&name).capacity(8).slots(4, 64);
        let ch = if mpmc { builder.mpmc().create() } else { builder.create() }.unwrap();
        let rx = ch.receiver().unwrap();
        Peer::spawn("a_dead_senders_pool_goes_once_its_messages_are_received", "victim", &name)
            .died();
        assert_eq!(owner_died(&name), [Some(true)], "the kernel marked the dead sender's word");
        assert_eq!(common::leftovers_of(&name).len(), 2, "the channel and the dead sender's pool");
        for tag in 1..=3u64 {
            assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), tag);
        }
        assert_eq!(
            common::leftovers_of(&name),
            std::slice::from_ref(&name),
            "the pool went with its last message"
        );
        assert!(matches!(rx.recv_timeout(LIMIT), Err(gpuring::RecvTimeoutError::PeerDead)));

        // A live sender's word says alive; a departed one's is cleared.
        let tx = ch.sender().unwrap();
        assert_eq!(owner_died(&name), [Some(false)]);
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        lease.set_tag(4);
        tx.send(lease, TensorMeta::bytes(8)).unwrap();
        drop(tx);
        assert_eq!(owner_died(&name), [None]);
        assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), 4);
        drop((rx, ch));
        assert_eq!(common::leftovers_of(&name), Vec::<String>::new());
    }
}

/// A sender killed with messages queued whose open file descriptions outlive it: a child
/// it forked holds them, so the lock that says "this sender lives" stays held after its
/// death (a GPU driver tearing down a dead process's registered host memory keeps them a
/// while the same way: a GPU test saw it). The kernel marked the pool's owner word at the
/// death, and that is what the receiver goes by: it receives the messages and closes the
/// dead sender's pool, which goes with the last of them. Before, the live-looking lock
/// kept the pool's entry active (and the pool in `/dev/shm`) until the child let go.
#[test]
fn a_dead_senders_pool_is_closed_though_a_child_it_forked_holds_its_lock() {
    const TEST: &str = "a_dead_senders_pool_is_closed_though_a_child_it_forked_holds_its_lock";
    if role().as_deref() == Some("victim") {
        let _tx = send_three();
        // SAFETY: the child calls only async-signal-safe functions (sleep, _exit) and keeps
        // every descriptor and mapping it inherited until it is killed.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: async-signal-safe calls in a forked child.
            unsafe {
                libc::sleep(60);
                libc::_exit(0);
            }
        }
        common::announce(&format!("child {child}"));
        die();
    }
    let name = unique_name("dead-pool-child");
    let ch = Channel::builder(&name).capacity(8).slots(4, 64).create().unwrap();
    let rx = ch.receiver().unwrap();
    let mut victim = Peer::spawn(TEST, "victim", &name);
    let child: i32 = victim.expect("child").parse().unwrap();
    victim.died();
    assert_eq!(owner_died(&name), [Some(true)], "the kernel marked the dead sender's word");
    for tag in 1..=3u64 {
        assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), tag);
    }
    let pools = ch.pools();
    // SAFETY: the victim's child, which holds the victim's descriptions: killed, then
    // waited for (not ours to reap: its end is watched through /proc, a zombie counting
    // as gone, its descriptions closed).
    unsafe { libc::kill(child, libc::SIGKILL) };
    let stat = format!("/proc/{child}/stat");
    let gone = || {
        std::fs::read_to_string(&stat)
            .map_or(true, |s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
    };
    common::wait_for("the child's end", LIMIT, gone);
    assert!(pools.iter().all(|p| p.state == PoolState::Closed), "{pools:?}");
    assert!(matches!(rx.recv_timeout(LIMIT), Err(gpuring::RecvTimeoutError::PeerDead)));
    drop((rx, ch));
    assert_eq!(common::leftovers_of(&name), Vec::<String>::new());
}

/// An MPMC sender that dies after its messages were received, beside a live sender that
/// sends nothing: a receiver waiting for a message closes the dead sender's pool at a
/// liveness tick of its wait, and it goes from `/dev/shm` within a second. Before, it
/// stayed until a sender registered or the channel went.
#[test]
fn an_idle_receiver_closes_a_dead_senders_pool_within_a_tick() {
    if role().as_deref() == Some("victim") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let tx = send_one(&ch, 5);
        // Dies once the parent has received the message and given its slot back.
        while tx.free_slots() < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        die();
    }
    let name = unique_name("idle-closes");
    let ch = Channel::builder(&name).capacity(8).slots(2, 64).mpmc().create().unwrap();
    let rx = ch.receiver().unwrap();
    let live = ch.sender().unwrap();
    let mut victim =
        Peer::spawn("an_idle_receiver_closes_a_dead_senders_pool_within_a_tick", "victim", &name);
    assert_eq!(rx.recv_timeout(LIMIT).unwrap().tag(), 5);
    victim.died();
    assert_eq!(common::leftovers_of(&name).len(), 3, "the channel and both pools");
    let start = std::time::Instant::now();
    while common::leftovers_of(&name).len() == 3 && start.elapsed() < Duration::from_secs(1) {
        assert!(matches!(
            rx.recv_timeout(Duration::from_millis(10)),
            Err(gpuring::RecvTimeoutError::Timeout)
        ));
    }
    println!(
        "dead sender's pool gone {:.1} ms after its death was seen",
        start.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(
        common::leftovers_of(&name),
        [name.clone(), live.pool_name().trim_start_matches('/').to_owned()]
    );
}

/// A receiver killed holding a message whose sent copy a hostile process then rewrote (a
/// descriptor of another slot, then impossible metadata): the next receiver refuses it as
/// `Corrupted`, reading nothing, and the slot goes back to the sender; the next message
/// arrives as usual.
#[test]
fn a_forged_sent_copy_is_corrupted_and_its_slot_comes_back() {
    use std::os::unix::fs::FileExt;
    const TEST: &str = "a_forged_sent_copy_is_corrupted_and_its_slot_comes_back";
    if role().as_deref() == Some("holder") {
        let ch = Channel::builder(ring_name()).open().unwrap();
        let m = ch.receiver().unwrap().recv_timeout(LIMIT).unwrap();
        common::announce(&format!("holding {}", m.tag()));
        die();
    }
    let layout = gpuring::internal::PoolLayout::new(2, 64).unwrap();
    for forged in ["another slot", "bad metadata"] {
        let name = unique_name("forged-copy");
        let ch = Channel::builder(&name).capacity(8).slots(2, 64).create().unwrap();
        let tx = send_one(&ch, 1);
        let mut holder = Peer::spawn(TEST, "holder", &name);
        assert_eq!(holder.expect("holding"), "1");
        holder.died();
        let pool = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm/{}", tx.pool_name().trim_start_matches('/')))
            .unwrap();
        // Slot 0's copy: `slot` at byte 20, `ndim` at byte 53 of the descriptor.
        let (at, bytes): (u64, &[u8]) =
            if forged == "another slot" { (20, &1u32.to_le_bytes()) } else { (53, &[200]) };
        pool.write_all_at(bytes, (layout.sent_offset(0) as u64) + at).unwrap();
        let rx = ch.receiver().unwrap();
        match rx.recv_timeout(LIMIT) {
            Err(gpuring::RecvTimeoutError::Corrupted(c)) => println!("{forged}: {}", c.what),
            other => panic!("{forged}: expected Corrupted, got {other:?}"),
        }
        let both: Vec<_> = (0..2).map(|_| tx.acquire_timeout(LIMIT).unwrap()).collect();
        drop(both);
        let mut lease = tx.acquire_timeout(LIMIT).unwrap();
        lease.set_tag(2);
        tx.send(lease, TensorMeta::bytes(8)).unwrap();
        let m = rx.recv_timeout(LIMIT).unwrap();
        assert_eq!((m.tag(), m.redelivered()), (2, false), "{forged}");
    }
}

/// A receiver that holds up to 2 messages at a time (dropping the oldest as a third comes)
/// until it is killed; it announces each message's number, and whether it was a
/// redelivery, before holding it.
fn holding_receiver() -> ! {
    let ch = Channel::builder(ring_name()).open().unwrap();
    let rx = ch.receiver().unwrap();
    let mut held = std::collections::VecDeque::new();
    loop {
        let m = rx.recv().unwrap();
        common::announce(&format!("got {} {}", m.tag(), m.redelivered()));
        held.push_back(m);
        if held.len() > 2 {
            held.pop_front();
        }
    }
}

/// Receiver kill storms as an independent suite runs them: a sender streams into a channel
/// of 16 slots while receivers, each holding up to 2 messages, are SIGKILLed at random
/// 40–250 ms after they start and replaced at once (25 kills; SPSC and MPMC). No blocking
/// call of the sender may stall: each `acquire` and `send` has a 5 s limit, and the longest
/// is printed (it includes waiting for the next receiver to start). Nothing is lost: every
/// message sent reaches a receiver (the killed ones announce each message they got) or the
/// last receiver, which drains the stream; a message that comes twice is marked a
/// redelivery. Every slot comes back, and nothing is left in `/dev/shm`.
/// `GPURING_STORM_RUNS` repeats each flavor (default 1). The hang this looks for was a
/// stalled free-ring cell (`tests/faults.rs` `receiver_killed_after_winning_its_free_ring_cell`).
#[test]
fn receiver_kill_storms_never_stall_the_sender() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    if role().as_deref() == Some("receiver") {
        holding_receiver();
    }
    const KILLS: u32 = 25;
    const CALL_LIMIT: Duration = Duration::from_secs(5);
    let runs: u32 =
        std::env::var("GPURING_STORM_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let mut rng = common::Rand::from_pid(0x2545_f491_4f6c_dd1d);
    let mut rand = move |n: u64| rng.below(n);
    for mpmc in [false, true] {
        let mut worst = Duration::ZERO;
        for run in 0..runs {
            let name = unique_name(if mpmc { "storm-mpmc" } else { "storm-spsc" });
            let b = Channel::builder(&name).capacity(16).slots(16, 64);
            let ch = if mpmc { b.mpmc() } else { b }.create().unwrap();
            let tx = ch.sender().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let longest = Arc::new(Mutex::new((Duration::ZERO, "")));
            let streamer = {
                let (stop, longest) = (stop.clone(), longest.clone());
                std::thread::spawn(move || {
                    let mut sent = 0u64;
                    let note = |what: &'static str, t: Instant| {
                        let took = t.elapsed();
                        let mut l = longest.lock().unwrap();
                        if took > l.0 {
                            *l = (took, what);
                        }
                        assert!(took < CALL_LIMIT, "{what} blocked {took:?}");
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let acquired = tx.acquire_timeout(CALL_LIMIT);
                        note("acquire", t);
                        let mut lease = match acquired {
                            Ok(lease) => lease,
                            // Between a kill and its replacement, with every slot held by
                            // the dead receiver or queued: it says so, at a tick.
                            Err(gpuring::AcquireTimeoutError::PeerDead) => {
                                std::thread::sleep(Duration::from_millis(1));
                                continue;
                            }
                            Err(e) => panic!("acquire stalled after {sent}: {e}"),
                        };
                        lease.set_tag(sent);
                        let t = Instant::now();
                        match tx.send_timeout(lease, TensorMeta::bytes(8), CALL_LIMIT) {
                            Ok(()) => sent += 1,
                            // Between a kill and its replacement: the lease comes back.
                            Err(gpuring::SendTimeoutError::PeerDead(_)) => {}
                            Err(e) => panic!("send stalled after {sent}: {e}"),
                        }
                        note("send", t);
                    }
                    (tx, sent)
                })
            };
            let got = Arc::new(Mutex::new(Deliveries::default()));
            for _ in 0..KILLS {
                let got = got.clone();
                let (mut child, reader) = common::spawn_reading(
                    "receiver_kill_storms_never_stall_the_sender",
                    "receiver",
                    &name,
                    &[],
                    move |line| got.lock().unwrap().note_line(line),
                );
                std::thread::sleep(Duration::from_millis(40 + rand(211)));
                child.kill().unwrap();
                let status = child.wait().unwrap();
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(9), "killed: {status}");
                reader.join().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            let (tx, sent) = streamer.join().expect("the sender stalled");
            let rx = ch.receiver().unwrap();
            while let Ok(m) = rx.recv_timeout(Duration::from_millis(200)) {
                got.lock().unwrap().note(m.tag(), m.redelivered());
            }
            let what = format!("mpmc {mpmc}, run {run}");
            let again = got.lock().unwrap().check(sent, &what);
            let all: Vec<_> = (0..16)
                .map(|_| tx.acquire_timeout(CALL_LIMIT))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("mpmc {mpmc}, run {run}: a slot never came back: {e}"));
            drop(all);
            let (took, what) = *longest.lock().unwrap();
            println!(
                "mpmc {mpmc}, run {run}: {sent} sent, none lost, {again} redelivered, longest \
                 blocking call {took:?} ({what})"
            );
            worst = worst.max(took);
            drop((rx, tx, ch));
            assert_eq!(common::leftovers_of(&name), Vec::<String>::new(), "mpmc {mpmc}, run {run}");
        }
        println!("mpmc {mpmc}: {runs} storms of {KILLS} kills, longest blocking call {worst:?}");
    }
}
