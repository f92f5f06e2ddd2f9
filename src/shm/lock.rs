//! Open-file-description byte locks on a segment's object: the mechanism of liveness.

use std::io;

use rustix::io::Errno;

use super::ShmError;
use super::error::io_err;

/// The byte of a segment's object that every handle holds a shared lock on for as long as
/// it has the segment open (creator and openers alike): "in use". Whoever takes it
/// exclusively is alone with the segment, and nobody can open it meanwhile.
pub(super) const PRESENCE_BYTE: u64 = 0;

/// An open-file-description lock operation on one byte of `fd`'s object. OFD locks belong
/// to the open file description, not to the process (so threads and handles do not steal
/// each other's), are released when it is closed and by the kernel when the process dies,
/// and can be probed by any process that can open the object: a liveness signal that
/// cannot be forged by writing shared memory and does not trust pids.
pub(super) fn ofd_lock(
    fd: std::os::fd::BorrowedFd<'_>,
    cmd: libc::c_int,
    l_type: libc::c_short,
    byte: u64,
) -> Result<libc::flock, Errno> {
    use std::os::fd::AsRawFd;
    // Miri cannot make this syscall; its tests use no named segment (they are ignored there).
    if cfg!(miri) {
        return Err(Errno::NOSYS);
    }
    // SAFETY: an all-zero `flock` is a valid value of this plain C struct.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = l_type;
    lock.l_whence = libc::SEEK_SET as _;
    lock.l_start = byte as libc::off_t;
    lock.l_len = 1;
    // SAFETY: `fd` is open for the call (borrowed); `lock` is a valid `flock` that the
    // kernel reads and, for F_OFD_GETLK, writes; l_pid is 0 as OFD commands require.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut lock as *mut libc::flock) };
    if r == -1 {
        Err(Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::IO))
    } else {
        Ok(lock)
    }
}

/// Whether some open file description other than `fd`'s has the object open as a gpuring
/// handle (holds its presence lock), for tools that read a segment without opening it as
/// one.
pub(crate) fn presence_held(fd: std::os::fd::BorrowedFd<'_>) -> Result<bool, ShmError> {
    held_elsewhere(fd, PRESENCE_BYTE).map_err(io_err("fcntl(F_OFD_GETLK)"))
}

/// Takes the write (exclusive) lock on `byte`; `Ok(false)` if another description holds a
/// lock on it.
pub(super) fn lock_byte(fd: std::os::fd::BorrowedFd<'_>, byte: u64) -> Result<bool, Errno> {
    set_lock(fd, libc::F_WRLCK as _, byte)
}

/// Takes the read (shared) lock on `byte`; `Ok(false)` if another description holds the
/// write lock.
pub(super) fn lock_byte_shared(fd: std::os::fd::BorrowedFd<'_>, byte: u64) -> Result<bool, Errno> {
    set_lock(fd, libc::F_RDLCK as _, byte)
}

fn set_lock(
    fd: std::os::fd::BorrowedFd<'_>,
    l_type: libc::c_short,
    byte: u64,
) -> Result<bool, Errno> {
    match ofd_lock(fd, libc::F_OFD_SETLK, l_type, byte) {
        Ok(_) => Ok(true),
        Err(Errno::AGAIN | Errno::ACCESS) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives up this description's lock on `byte` (none held: nothing happens).
pub(super) fn unlock_byte(fd: std::os::fd::BorrowedFd<'_>, byte: u64) {
    // Cannot fail for a valid descriptor; if it did, the lock would go with the
    // description anyway.
    let _ = ofd_lock(fd, libc::F_OFD_SETLK, libc::F_UNLCK as _, byte);
}

/// Whether another description holds a lock on `byte` (this one's own locks never show).
pub(super) fn held_elsewhere(fd: std::os::fd::BorrowedFd<'_>, byte: u64) -> Result<bool, Errno> {
    let found = ofd_lock(fd, libc::F_OFD_GETLK, libc::F_WRLCK as _, byte)?;
    Ok(found.l_type != libc::F_UNLCK as libc::c_short)
}
