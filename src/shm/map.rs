//! The system calls under `Segment::create` and `Segment::open`: what a failed
//! `shm_open` means, mapping an object, and undoing a half-made one.

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm;

use super::{ShmError, io_err};

/// Unlinks a half-made object if creation fails before a `Segment` owns it.
pub(super) struct UnlinkOnError<'a>(pub(super) Option<&'a CString>);

impl Drop for UnlinkOnError<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.0 {
            let _ = shm::unlink(name.as_c_str());
        }
    }
}

/// Why one try at opening a name did not give a segment.
pub(super) enum OpenTry {
    /// No object of that name (yet), or the one found was removed: look again.
    Missing,
    /// A final error.
    Failed(ShmError),
}

impl From<ShmError> for OpenTry {
    fn from(e: ShmError) -> Self {
        OpenTry::Failed(e)
    }
}

/// What a failed `shm_open` of object `name` means.
pub(super) fn open_error(e: Errno, name: &str) -> ShmError {
    let name = name.to_owned();
    match e {
        Errno::EXIST => ShmError::AlreadyExists { name },
        Errno::NOENT => ShmError::NotFound { name },
        Errno::ACCESS => {
            ShmError::PermissionDenied { name, reason: "the kernel refused access (EACCES)".into() }
        }
        e => io_err("shm_open")(e),
    }
}

pub(super) fn map_object(
    fd: &OwnedFd,
    len: usize,
    populate: bool,
) -> Result<NonNull<u8>, ShmError> {
    // POPULATE pre-faults the pages so the hot path takes no page fault (openers populate
    // later, once the size is checked: `Segment::populate`).
    let flags = if populate { MapFlags::SHARED | MapFlags::POPULATE } else { MapFlags::SHARED };
    // SAFETY: a fresh shared mapping of `len` bytes of `fd` at an address of the kernel's
    // choosing; it aliases nothing in this process.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            flags,
            fd,
            0,
        )
    }
    .map_err(io_err("mmap"))?;
    NonNull::new(p.cast())
        .ok_or(ShmError::Io { op: "mmap", source: io::Error::other("mmap returned null") })
}
