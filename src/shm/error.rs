//! [`ShmError`]: why a named segment could not be created or opened.

use std::fmt;
use std::io;
use std::time::Duration;

use rustix::io::Errno;

use crate::layout::{Corrupted, SegmentKind};

/// Why a named segment could not be created or opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum ShmError {
    /// The name is not a valid shared-memory name.
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `create`: a segment of that name exists.
    AlreadyExists {
        /// The segment's name.
        name: String,
    },
    /// `open`: no segment of that name.
    NotFound {
        /// The segment's name.
        name: String,
    },
    /// The segment belongs to another user, has a mode other than 0600, or the kernel
    /// refused access.
    PermissionDenied {
        /// The segment's name.
        name: String,
        /// What was found.
        reason: String,
    },
    /// The segment's size is not the one its header (or parameters) call for.
    SizeMismatch {
        /// The size expected, in bytes.
        expected: u64,
        /// The size found.
        found: u64,
    },
    /// The segment does not start with gpuring's magic number.
    BadMagic {
        /// The first 8 bytes found.
        found: u64,
    },
    /// The segment was made by a gpuring with another shared-memory layout.
    VersionMismatch {
        /// This build's layout version.
        expected: u32,
        /// The segment's.
        found: u32,
    },
    /// The creator had not finished initialising the segment by the deadline (it may have
    /// died half-way).
    NotInitialized {
        /// The segment's name.
        name: String,
        /// How long `open` waited.
        waited: Duration,
    },
    /// The segment holds another kind of object (e.g. an MPMC ring opened as SPSC).
    KindMismatch {
        /// The kind asked for.
        expected: SegmentKind,
        /// The raw kind found.
        found: u32,
    },
    /// `create`: the shared-memory file system (`/dev/shm`) cannot hold a segment of this
    /// size: nothing was created. Checked, and the space reserved, before anything is
    /// written, so that running out is this error and never a SIGBUS or an out-of-memory
    /// kill later.
    NoSpace {
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes the file system had free for it.
        available: u64,
    },
    /// A value in the segment is impossible.
    Corrupted(Corrupted),
    /// A system call failed.
    Io {
        /// The operation, e.g. `"mmap"`.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::InvalidName { name, reason } => {
                write!(f, "invalid shared-memory name {name:?}: {reason}")
            }
            ShmError::AlreadyExists { name } => write!(
                f,
                "segment {name} already exists: open it (`open`, or `open_or_create` to \
                 attach to it or create it), or, if a crashed run left it, remove it \
                 (`gpuring clean --queued {0}` drops what waits in it; `replace_stale` \
                 replaces it when no process has it open)",
                name.trim_start_matches('/')
            ),
            ShmError::NotFound { name } => write!(
                f,
                "segment {name} does not exist (check the name, or give `open_timeout` \
                 time for its creator to start)"
            ),
            ShmError::PermissionDenied { name, reason } => {
                write!(f, "segment {name} refused: {reason}")
            }
            ShmError::SizeMismatch { expected, found } => {
                write!(f, "segment size is {found} bytes, expected {expected}")
            }
            ShmError::BadMagic { found } => {
                write!(f, "not a gpuring segment (magic {found:#018x})")
            }
            ShmError::VersionMismatch { expected, found } => write!(
                f,
                "segment has layout version {found}, this build of gpuring uses {expected}"
            ),
            ShmError::NotInitialized { name, waited } => write!(
                f,
                "segment {name} was not initialised within {waited:?} (its creator may have \
                 died creating it: `gpuring clean` removes it once no process has it open)"
            ),
            ShmError::KindMismatch { expected, found } => match SegmentKind::from_raw(*found) {
                Some(kind) if kind.is_channel() && expected.is_channel() => write!(
                    f,
                    "the segment is {}, not {} (leave out `.spsc()` / `.mpmc()`, and `open` \
                     takes the flavor it finds)",
                    kind.describe(),
                    expected.describe()
                ),
                Some(kind) => {
                    write!(f, "the segment is {}, not {}", kind.describe(), expected.describe())
                }
                None => {
                    write!(f, "the segment holds unknown kind {found}, not {}", expected.describe())
                }
            },
            ShmError::NoSpace { needed, available } => write!(
                f,
                "/dev/shm cannot hold {}: {} free (ask for fewer or smaller slots, or give \
                 the machine more shared memory: a container's is 64 MB unless started with \
                 `--shm-size`)",
                crate::shm::human_bytes(*needed),
                crate::shm::human_bytes(*available)
            ),
            ShmError::Corrupted(c) => c.fmt(f),
            ShmError::Io { op, source } => write!(f, "{op} failed: {source}"),
        }
    }
}

io_error_source!(ShmError);

error_from!(ShmError { Corrupted(Corrupted) });

pub(super) fn io_err(op: &'static str) -> impl FnOnce(Errno) -> ShmError {
    move |e| ShmError::Io { op, source: io::Error::from_raw_os_error(e.raw_os_error()) }
}
