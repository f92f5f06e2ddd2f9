//! The raw floor of the ring benchmarks: a page of shared memory with two counters, each
//! on its own line, and a raw descriptor cell per direction (the least that moving a
//! descriptor takes).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use gpuring::Descriptor;

#[repr(C, align(128))]
pub struct Line<T>(pub T);

/// A descriptor and the stamp that publishes it: the least that moving one takes.
#[repr(C, align(128))]
pub struct RawCell {
    stamp: AtomicU64,
    value: std::cell::UnsafeCell<Descriptor>,
}

impl RawCell {
    pub fn send(&self, d: Descriptor, stamp: u64) {
        // Ask for every line of the cell for writing at once (as gpuring's producers do):
        // the stores alone fetch them one miss after another, which measured 1.4-1.6x
        // slower on an H100 VM. Runs before O (docs/BENCHMARKS.md) timed this floor
        // without it.
        #[cfg(target_arch = "x86_64")]
        for offset in (0..size_of::<Self>()).step_by(64) {
            // SAFETY: PREFETCHW only hints; it cannot fault or change memory, and decodes
            // as a NOP where unsupported. The address is inside `self`.
            unsafe {
                std::arch::asm!(
                    "prefetchw byte ptr [{0}]",
                    in(reg) (self as *const Self).cast::<u8>().wrapping_add(offset),
                    options(nostack, preserves_flags)
                )
            };
        }
        // SAFETY: the reader reads the value only after seeing this stamp, and the writer
        // waits for the reply before writing again.
        unsafe { self.value.get().write(d) };
        self.stamp.store(stamp, Ordering::Release);
    }

    pub fn recv(&self, stamp: u64) -> Descriptor {
        while self.stamp.load(Ordering::Acquire) != stamp {
            std::hint::spin_loop();
        }
        // SAFETY: published by the Release store above; not rewritten before our reply.
        unsafe { self.value.get().read() }
    }
}

#[repr(C)]
pub struct Floor {
    pub ping: Line<AtomicU64>,
    pub pong: Line<AtomicU64>,
    pub ping32: Line<AtomicU32>,
    pub pong32: Line<AtomicU32>,
    pub ping_cell: RawCell,
    pub pong_cell: RawCell,
}

const _: () = assert!(size_of::<Floor>() <= 4096);

/// The floor's page of shared memory.
pub type FloorMap = super::SharedPage<Floor>;

pub fn futex_wake(word: &AtomicU32) {
    futex_wake_as(word, false);
}

/// `FUTEX_PRIVATE_FLAG` where `private`: the kernel keys the word by (process, address),
/// without looking its page up; only threads of one process can meet on such a word. A
/// shared futex in a shared-memory page is keyed by the file's inode and the page's offset,
/// found through the page on every wait and every wake.
fn flags(private: bool) -> rustix::thread::futex::Flags {
    if private {
        rustix::thread::futex::Flags::PRIVATE
    } else {
        rustix::thread::futex::Flags::empty()
    }
}

pub fn futex_wait_as(word: &AtomicU32, expected: u32, private: bool) {
    let _ = rustix::thread::futex::wait(word, flags(private), expected, None);
}

pub fn futex_wake_as(word: &AtomicU32, private: bool) {
    let _ = rustix::thread::futex::wake(word, flags(private), 1);
}

/// One turn of the raw futex ping-pong, from the side that pings: stores `seq` in `ping`,
/// wakes its sleeper, and sleeps until `pong` says `seq`.
pub fn futex_turn(ping: &AtomicU32, pong: &AtomicU32, seq: u32, private: bool) {
    // Release/Acquire: the handshake itself is what is measured (partner: `futex_answer`).
    ping.store(seq, Ordering::Release);
    futex_wake_as(ping, private);
    loop {
        let v = pong.load(Ordering::Acquire);
        if v == seq {
            return;
        }
        futex_wait_as(pong, v, private);
    }
}

/// The side that answers: sleeps on `ping`, runs `carry` with each new value, answers it
/// on `pong` and wakes; returns when `ping` says `u32::MAX`.
pub fn futex_answer(ping: &AtomicU32, pong: &AtomicU32, private: bool, mut carry: impl FnMut(u32)) {
    let mut last = 0;
    loop {
        // Acquire/Release: the handshake itself is what is measured (partner: `futex_turn`).
        let v = ping.load(Ordering::Acquire);
        if v == last {
            futex_wait_as(ping, last, private);
            continue;
        }
        if v == u32::MAX {
            return;
        }
        last = v;
        carry(v);
        pong.store(v, Ordering::Release);
        futex_wake_as(pong, private);
    }
}

/// The two-atomic floor's peer: answers each `ping` with the same `pong`, spinning.
pub fn floor_spin_peer(name: &str) {
    let map = FloorMap::open(name);
    let f = map.get();
    let mut last = 0;
    loop {
        // Acquire/Release: the handshake itself is what is measured.
        match f.ping.0.load(Ordering::Acquire) {
            u64::MAX => return,
            v if v != last => {
                last = v;
                f.pong.0.store(v, Ordering::Release);
            }
            _ => {}
        }
        std::hint::spin_loop();
    }
}

/// The descriptor floor's peer: returns each descriptor through the other raw cell.
pub fn floor_descriptor_peer(name: &str) {
    let map = FloorMap::open(name);
    let f = map.get();
    for stamp in 1.. {
        let d = f.ping_cell.recv(stamp);
        if d.seq == u64::MAX {
            return;
        }
        f.pong_cell.send(d, stamp);
    }
}

/// The raw futex floor's peer: sleeps on `ping32`, answers on `pong32` and wakes. With
/// `carry`, each turn also brings a descriptor back through the raw cells (read after the
/// word moved, written and stamped before the answer is stored): the least a sleeping hop
/// of 384 bytes takes.
pub fn floor_futex_peer(name: &str, carry: bool) {
    let map = FloorMap::open(name);
    let f = map.get();
    futex_answer(&f.ping32.0, &f.pong32.0, false, |v| {
        if carry {
            let d = f.ping_cell.recv(v.into());
            f.pong_cell.send(d, v.into());
        }
    });
}
