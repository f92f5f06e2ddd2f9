//! Who has a segment open, and removing it when the last one leaves.
//!
//! Every handle holds a shared lock on the presence byte of the object (see `lock.rs`) from
//! the moment it trusts the segment until it is dropped; the kernel drops it when the
//! process dies. Removing a segment takes that byte exclusively, which succeeds only when
//! no handle has it open and keeps anyone from opening it meanwhile:
//!
//! - **The last one out** (a handle's drop): gives up its shared lock, then tries for the
//!   exclusive one. Of several handles leaving at once, at least the last to try gets it
//!   (each has dropped its own lock first). Holding it, it checks the header's `removed`
//!   mark and asks the owner's [`LastOut`] check whether the segment may go; if so it sets
//!   the mark and unlinks the name.
//! - **A tool or a creator replacing a segment** ([`Segment::remove_if_unattended`]):
//!   opens the object by name and does the same from outside.
//! - **An opener** takes its shared lock once the segment is initialised, then reads the
//!   mark: a segment marked removed is being (or has been) unlinked, and the name is looked
//!   up again.
//!
//! Before unlinking, a remover checks that the name still refers to the object it holds
//! (device and inode): a name unlinked by someone else and created anew is never removed
//! by mistake.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::shm;

use super::error::io_err;
use super::lock::{PRESENCE_BYTE, lock_byte, lock_byte_shared, unlock_byte};
use super::{MAX_SEGMENT, Segment, ShmError, map_object, object_name};
use crate::layout::SegmentHeader;
use crate::sync::Ordering;

/// What the last handle out of a segment asks before removing it, alone with the segment
/// (nobody can open it meanwhile): `true` if it may go. The check may clean up what the
/// segment owns first (a channel removes its pools). It reads shared memory that any
/// process could have written: it must treat every value as untrusted.
pub(crate) type LastOut = Box<dyn Fn(&Segment) -> bool + Send + Sync>;

/// What [`Segment::remove_if_unattended`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// The segment was removed.
    Removed,
    /// Nobody has it open, but the check said it stays (e.g. elements still queued).
    Kept,
    /// A handle has it open.
    InUse,
    /// No such name (or not an object this user may remove).
    Absent,
}

impl Segment {
    /// Takes this handle's shared presence lock, waiting (until `deadline`) while a remover
    /// holds the byte exclusively. `false` if the segment was marked removed: the caller
    /// looks the name up again.
    pub(super) fn join(&self, deadline: Option<Instant>) -> Result<bool, ShmError> {
        while !lock_byte_shared(self.fd.as_fd(), PRESENCE_BYTE)
            .map_err(io_err("fcntl(F_OFD_SETLK)"))?
        {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Acquire: pairs with the Release store of the mark in `remove_locked`.
        Ok(self.header().removed.load(Ordering::Acquire) == 0)
    }

    /// This handle is leaving: if it is the last one (see the module docs), and `last_out`
    /// agrees, the segment is removed.
    pub(super) fn leave(&self, last_out: &LastOut) {
        let fd = self.fd.as_fd();
        unlock_byte(fd, PRESENCE_BYTE);
        if lock_byte(fd, PRESENCE_BYTE).unwrap_or(false) {
            // Acquire: pairs with the Release store of the mark in `remove_locked`.
            if self.header().removed.load(Ordering::Acquire) == 0 && last_out(self) {
                self.remove_locked();
            }
            unlock_byte(fd, PRESENCE_BYTE);
        }
    }

    /// Marks the segment removed and unlinks its name, holding the presence byte
    /// exclusively, if the name still refers to this object.
    fn remove_locked(&self) {
        if !same_object(&self.name, &self.fd) {
            return;
        }
        // Release: pairs with the Acquire loads of openers that take their lock after this
        // (they look the name up again).
        self.header().removed.store(1, Ordering::Release);
        let _ = shm::unlink(self.name.as_c_str());
    }

    /// Removes segment `name` if no handle has it open and `may_go` agrees, looking at it
    /// alone (nobody can open it meanwhile). `may_go` gets the mapped segment unchecked
    /// beyond its size: it must treat every value in it as untrusted. An object of this
    /// name that is not a gpuring segment (too small for a header) is removed too.
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::Io`].
    pub(crate) fn remove_if_unattended(
        name: &str,
        may_go: impl FnOnce(&Segment) -> bool,
    ) -> Result<Removal, ShmError> {
        let cname = object_name(name)?;
        let fd = match shm::open(cname.as_c_str(), shm::OFlags::RDWR, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::ACCESS) => return Ok(Removal::Absent),
            Err(e) => return Err(io_err("shm_open")(e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(io_err("fstat"))?;
        if stat.st_uid != rustix::process::geteuid().as_raw() {
            return Ok(Removal::Absent);
        }
        if !lock_byte(fd.as_fd(), PRESENCE_BYTE).map_err(io_err("fcntl(F_OFD_SETLK)"))? {
            return Ok(Removal::InUse);
        }
        let size = stat.st_size as u64;
        if size < size_of::<SegmentHeader>() as u64 || size > MAX_SEGMENT {
            // Not a segment we could map: a creator that died before sizing it, or a
            // stranger's object under our user.
            if same_object(&cname, &fd) {
                let _ = shm::unlink(cname.as_c_str());
            }
            return Ok(Removal::Removed);
        }
        let len = size as usize;
        let base = map_object(&fd, len, false)?;
        let guard = crate::bus_guard::register(base.as_ptr(), len);
        let segment = Segment {
            name: cname,
            base,
            len,
            fd,
            unlink_on_drop: false,
            last_out: None,
            guard,
            closes: std::sync::OnceLock::new(),
            pid: super::fork::current_pid(),
        };
        // Acquire: pairs with the Release store of the mark in `remove_locked`. A segment
        // already marked is one whose remover died before unlinking it.
        let marked = segment.header().removed.load(Ordering::Acquire) != 0;
        if marked || may_go(&segment) {
            segment.remove_locked();
            return Ok(Removal::Removed);
        }
        Ok(Removal::Kept)
        // Dropping `segment` closes the descriptor: the exclusive lock goes with it.
    }
}

/// Whether `name` still refers to the object open as `fd` (same device and inode).
fn same_object(name: &CString, fd: &OwnedFd) -> bool {
    let Ok(ours) = rustix::fs::fstat(fd) else { return false };
    let Ok(now) = shm::open(name.as_c_str(), shm::OFlags::RDONLY, Mode::empty()) else {
        return false;
    };
    rustix::fs::fstat(&now).is_ok_and(|s| s.st_dev == ours.st_dev && s.st_ino == ours.st_ino)
}
