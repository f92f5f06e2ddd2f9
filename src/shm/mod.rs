//! Named POSIX shared-memory segments: create exclusively, open with checks, and remove
//! when the last user leaves. Everything here goes through `rustix`.
//!
//! A segment starts with a [`SegmentHeader`]. [`Segment::create`] makes the object with
//! `O_CREAT | O_EXCL`, forces mode 0600 with `fchmod` (the umask cannot widen or narrow
//! it), checks that the shared-memory file system can hold it and reserves the space
//! (`fallocate`: running out is [`ShmError::NoSpace`] there, never a SIGBUS later), lets
//! the caller initialise the body, and writes the header's `init` word last with Release.
//! Any failure on the way unlinks the half-made object.
//!
//! [`Segment::open`] trusts nothing: the object must belong to this user with mode 0600,
//! be at least a header long, carry the magic and layout version, reach `init == READY`
//! before a deadline, be of the expected kind, and have exactly the size its header
//! states. A name that does not exist yet is waited for until the same deadline.
//!
//! **Lifetimes** (`presence.rs`). Every handle, the creator's and every opener's, holds a
//! shared open-file-description lock on byte 0 of the object for as long as it lives (the
//! kernel drops it when the process dies). The last handle out takes that byte
//! exclusively (so nobody can open the segment meanwhile), asks its owner whether the
//! segment may go (a ring or channel with elements still queued stays, for a consumer
//! that comes later), and if so marks it removed and unlinks the name. An opener checks
//! the mark once it holds its own lock, and looks the name up again if it is set.
//!
//! It also owns the other byte locks on a segment's object (see [`Segment::lock_byte`]),
//! the mechanism that [`crate::liveness`] builds on.
//!
//! This module knows the header, not what follows it: its errors ([`ShmError`]) are about
//! segments, never about rings, pools or channels.
//!
//! | file | what lives there |
//! |---|---|
//! | `mod.rs` | [`Segment`]: create, open, map |
//! | `map.rs` | the system calls under create and open: `shm_open`'s errors, `mmap`, undoing a half-made object |
//! | `presence.rs` | who has a segment open; the last one out removes it |
//! | `space.rs` | whether `/dev/shm` can hold a segment, and reserving it |
//! | `error.rs` | [`ShmError`] |
//! | `options.rs` | the create/open options every named object shares, and their setters |
//! | `lock.rs` | open-file-description byte locks |
//! | `fork.rs` | which process a handle belongs to (a forked child's copies act for nobody) |
//! | `tests.rs` | unit tests |

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::mm::Advice;
use rustix::shm;

use crate::layout::{Corrupted, INIT_READY, LAYOUT_VERSION, MAGIC, SegmentHeader, SegmentKind};
use crate::sync::Ordering;

mod error;
mod fork;
mod lock;
mod map;
mod options;
mod presence;
mod space;

pub use error::ShmError;
use error::io_err;
pub(crate) use fork::current_pid;
pub(crate) use lock::presence_held;
use lock::{PRESENCE_BYTE, held_elsewhere, lock_byte, lock_byte_shared, unlock_byte};
use map::map_object;
use map::{OpenTry, UnlinkOnError, open_error};
pub use options::DEFAULT_OPEN_TIMEOUT;
pub(crate) use options::{SegmentOptions, open_or_create, segment_options};
pub(crate) use presence::{LastOut, Removal};
pub use space::{available, human_bytes};

/// Largest segment `open` will map (1 TiB): a bound on what a forged size can ask for.
const MAX_SEGMENT: u64 = 1 << 40;

/// The shared-memory object name for `name`: a leading `/` is added if missing.
///
/// # Errors
///
/// [`ShmError::InvalidName`] for an empty name, one with `/` or NUL inside, `.`/`..`, or
/// longer than 250 bytes.
pub fn object_name(name: &str) -> Result<CString, ShmError> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    let reason = if bare.is_empty() {
        Some("empty")
    } else if bare.len() > 250 {
        Some("longer than 250 bytes")
    } else if bare.contains('/') {
        Some("contains '/' after the first character")
    } else if bare.contains('\0') {
        Some("contains a NUL byte")
    } else if bare == "." || bare == ".." {
        Some("'.' and '..' are not object names")
    } else {
        None
    };
    if let Some(reason) = reason {
        return Err(ShmError::InvalidName { name: name.to_owned(), reason });
    }
    Ok(CString::new(format!("/{bare}")).expect("checked: no NUL"))
}

/// A mapped shared-memory segment.
///
/// Every handle holds the segment's presence lock while it lives. Dropping the last
/// handle (anywhere) of a segment whose owner set a `LastOut` check removes the name if
/// the check agrees; the mapping itself lives on in every process that still has it
/// mapped.
pub struct Segment {
    name: CString,
    base: NonNull<u8>,
    len: usize,
    // Its open file description carries this handle's locks (presence, and the liveness
    // locks of `lock_byte`); closing it drops them, as the kernel does at death.
    fd: OwnedFd,
    /// Set while this handle is creating the segment: a failure unlinks the half-made
    /// object.
    unlink_on_drop: bool,
    /// What the last handle out asks before removing the segment (`None`: never removes
    /// it; pools, which their channel removes).
    last_out: Option<LastOut>,
    /// The SIGBUS guard of the mapping (`None` when the guard table is full).
    guard: Option<crate::bus_guard::Guard>,
    /// The inotify watch of the object's closes, made for the first async wait or select
    /// on it.
    closes: std::sync::OnceLock<std::sync::Arc<crate::wait::reactor::Closes>>,
    /// The process that made this handle (see `fork.rs`).
    pid: u32,
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment").field("name", &self.name).field("len", &self.len).finish()
    }
}

// SAFETY: the mapping is plain shared memory, valid for the life of the value, and every
// access to it goes through atomics or the ring protocol; the pointer is not tied to a
// thread. `last_out` is `Send + Sync`.
unsafe impl Send for Segment {}
// SAFETY: as above: `&Segment` only hands out shared references to atomics and cells whose
// access the ring protocol governs.
unsafe impl Sync for Segment {}

// SAFETY: `base..base + len` is the mapping made in `map_object` (page-aligned by mmap),
// unmapped only when the segment drops; neither field changes.
unsafe impl crate::layout::Mapping for Segment {
    fn base(&self) -> NonNull<u8> {
        self.base
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Segment {
    /// Creates segment `name` of `size` bytes holding a `kind`, exclusively, mode 0600.
    /// With `replace_stale`, a segment of that name that nobody has open (whatever it
    /// holds) is removed and created afresh; one in use, or an object of another user,
    /// still gives [`ShmError::AlreadyExists`].
    ///
    /// `init` writes the body (the memory is zeroed); the header's `init` word is written
    /// after it returns, with Release, so openers see a finished segment or none.
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::AlreadyExists`], [`ShmError::NoSpace`],
    /// [`ShmError::PermissionDenied`], [`ShmError::Io`], or what `init` returns. On any
    /// error the object is unlinked.
    pub(crate) fn create<E: From<ShmError>>(
        name: &str,
        kind: SegmentKind,
        size: usize,
        replace_stale: bool,
        init: impl FnOnce(&Segment) -> Result<(), E>,
    ) -> Result<Segment, E> {
        let mut segment = Self::create_object(name, kind, size, replace_stale)?;
        init(&segment)?;
        // Release: pairs with the Acquire load of `init` in `open`; every write in
        // `create_object` and in `init` is visible to an opener that sees READY.
        segment.header().init.store(INIT_READY, Ordering::Release);
        segment.unlink_on_drop = false;
        Ok(segment)
    }

    /// [`create`](Self::create) up to the body: the object, its presence lock, its size
    /// (checked against the space free, and reserved), the mapping and the header (all
    /// but `init`).
    fn create_object(
        name: &str,
        kind: SegmentKind,
        size: usize,
        replace_stale: bool,
    ) -> Result<Segment, ShmError> {
        assert!(size >= size_of::<SegmentHeader>(), "a segment holds at least its header");
        let cname = object_name(name)?;
        if replace_stale {
            // Another process may replace it at the same time: one removal wins, and one
            // O_EXCL create below; the other gets AlreadyExists, as it should.
            Self::remove_if_unattended(name, |_| true)?;
        }
        space::check(size as u64)?;
        let display = cname.to_string_lossy().into_owned();
        let fd = shm::open(
            cname.as_c_str(),
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| open_error(e, &display))?;
        let mut guard = UnlinkOnError(Some(&cname));
        // Our presence before anything else: an opener trusts the segment only once `init`
        // is READY, by which time it is held.
        if !lock_byte_shared(fd.as_fd(), PRESENCE_BYTE).map_err(io_err("fcntl(F_OFD_SETLK)"))? {
            return Err(ShmError::Io {
                op: "fcntl(F_OFD_SETLK)",
                source: io::Error::other("a fresh segment is locked exclusively elsewhere"),
            });
        }
        rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(io_err("fchmod"))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(io_err("ftruncate"))?;
        space::reserve(&fd, size as u64)?;
        let base = map_object(&fd, size, true)?;
        guard.0 = None; // from here the Segment's Drop unlinks
        drop(guard);
        let guard = crate::bus_guard::register(base.as_ptr(), size);
        let segment = Segment {
            name: cname,
            base,
            len: size,
            fd,
            unlink_on_drop: true,
            closes: std::sync::OnceLock::new(),
            last_out: None,
            guard,
            pid: fork::current_pid(),
        };

        let header = segment.header();
        // Relaxed: nobody may read these before `init` is READY (Release in `create`).
        header.magic.store(MAGIC, Ordering::Relaxed);
        header.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        header.kind.store(kind as u32, Ordering::Relaxed);
        header.total_size.store(size as u64, Ordering::Relaxed);
        header
            .creator_pid
            .store(rustix::process::getpid().as_raw_nonzero().get() as u32, Ordering::Relaxed);
        Ok(segment)
    }

    /// Opens segment `name`, which must hold a `kind`, waiting up to `timeout` for the name
    /// to appear and for its creator to finish initialising it.
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::NotFound`] (still no such name after
    /// `timeout`), [`ShmError::PermissionDenied`] (another owner, or a mode other than
    /// 0600), [`ShmError::SizeMismatch`], [`ShmError::BadMagic`],
    /// [`ShmError::VersionMismatch`], [`ShmError::NotInitialized`],
    /// [`ShmError::KindMismatch`], [`ShmError::Io`].
    pub fn open(name: &str, kind: SegmentKind, timeout: Duration) -> Result<Segment, ShmError> {
        Self::open_checked(name, &[kind], timeout, true).map(|(segment, _)| segment)
    }

    /// Opens segment `name` whatever gpuring kind it holds (with every other check of
    /// [`open`](Self::open)), and says which kind: for tools that look at segments. The
    /// handle does not count as a user of the segment (it takes no presence lock), so
    /// looking never keeps a segment from being removed.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open); [`ShmError::Corrupted`] for a kind this version does not
    /// know.
    pub fn open_any(name: &str, timeout: Duration) -> Result<(Segment, SegmentKind), ShmError> {
        Self::open_checked(name, &[], timeout, false)
    }

    /// Opens segment `name`, which must hold one of `kinds` (any kind this version knows
    /// when `kinds` is empty; [`ShmError::KindMismatch`] names the first otherwise), as a
    /// user of it (`present`) or as a tool that only looks.
    pub(crate) fn open_checked(
        name: &str,
        kinds: &[SegmentKind],
        timeout: Duration,
        present: bool,
    ) -> Result<(Segment, SegmentKind), ShmError> {
        let cname = object_name(name)?;
        let started = Instant::now();
        let deadline = started.checked_add(timeout);
        loop {
            match Self::open_once(&cname, kinds, present, started, deadline) {
                Ok(opened) => return Ok(opened),
                Err(OpenTry::Failed(e)) => return Err(e),
                Err(OpenTry::Missing) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    let name = cname.to_string_lossy().into_owned();
                    return Err(ShmError::NotFound { name });
                }
                // Not there yet (or removed just now): the creator may come.
                Err(OpenTry::Missing) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    /// One try of [`open_checked`](Self::open_checked).
    fn open_once(
        cname: &CString,
        kinds: &[SegmentKind],
        present: bool,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<(Segment, SegmentKind), OpenTry> {
        let display = cname.to_string_lossy().into_owned();
        let fd = match shm::open(cname.as_c_str(), shm::OFlags::RDWR, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Err(OpenTry::Missing),
            Err(e) => return Err(open_error(e, &display).into()),
        };
        let expired = || deadline.is_some_and(|d| Instant::now() >= d);

        let stat = rustix::fs::fstat(&fd).map_err(io_err("fstat"))?;
        let me = rustix::process::geteuid().as_raw();
        if stat.st_uid != me {
            let reason = format!("owned by uid {}, this process runs as uid {me}", stat.st_uid);
            return Err(ShmError::PermissionDenied { name: display, reason }.into());
        }
        let mode = stat.st_mode & 0o7777;
        if mode != 0o600 {
            let reason = format!("mode {mode:04o}, gpuring segments must be 0600");
            return Err(ShmError::PermissionDenied { name: display, reason }.into());
        }

        // The creator sizes the object right after creating it; wait out that window.
        let header_size = size_of::<SegmentHeader>() as u64;
        let mut size = stat.st_size as u64;
        while size < header_size {
            if expired() {
                return Err(if size == 0 {
                    ShmError::NotInitialized { name: display, waited: started.elapsed() }
                } else {
                    ShmError::SizeMismatch { expected: header_size, found: size }
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(1));
            size = rustix::fs::fstat(&fd).map_err(io_err("fstat"))?.st_size as u64;
        }
        if size > MAX_SEGMENT {
            return Err(ShmError::SizeMismatch { expected: MAX_SEGMENT, found: size }.into());
        }
        let len = size as usize;
        // Not populated: the size is only the object's own claim so far, and a forged
        // sparse object must not commit its pages before the caller has checked it
        // against what its header implies (`populate`).
        let base = map_object(&fd, len, false)?;
        let guard = crate::bus_guard::register(base.as_ptr(), len);
        let segment = Segment {
            name: cname.clone(),
            base,
            len,
            fd,
            unlink_on_drop: false,
            closes: std::sync::OnceLock::new(),
            last_out: None,
            guard,
            pid: fork::current_pid(),
        };
        let header = segment.header();

        loop {
            // Relaxed: a zero magic means "not yet written"; anything else but MAGIC means
            // this is not ours, whatever the init word says.
            let magic = header.magic.load(Ordering::Relaxed);
            if magic != 0 && magic != MAGIC {
                return Err(ShmError::BadMagic { found: magic }.into());
            }
            // Acquire: pairs with the Release store of READY in `create`.
            if header.init.load(Ordering::Acquire) == INIT_READY {
                break;
            }
            if expired() {
                let waited = started.elapsed();
                return Err(ShmError::NotInitialized { name: display, waited }.into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Each field read once, then checked.
        let magic = header.magic.load(Ordering::Relaxed);
        if magic != MAGIC {
            return Err(ShmError::BadMagic { found: magic }.into());
        }
        let version = header.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            let e = ShmError::VersionMismatch { expected: LAYOUT_VERSION, found: version };
            return Err(e.into());
        }
        let found_kind = header.kind.load(Ordering::Relaxed);
        let kind = match (SegmentKind::from_raw(found_kind), kinds.first()) {
            (Some(k), _) if kinds.is_empty() || kinds.contains(&k) => k,
            (_, Some(&expected)) => {
                return Err(ShmError::KindMismatch { expected, found: found_kind }.into());
            }
            (None, None) => {
                return Err(ShmError::Corrupted(Corrupted { what: "unknown segment kind" }).into());
            }
            (Some(_), None) => unreachable!("an empty list accepts every known kind"),
        };
        let total = header.total_size.load(Ordering::Relaxed);
        let now = rustix::fs::fstat(&segment.fd).map_err(io_err("fstat"))?.st_size as u64;
        if total != now || total != size {
            return Err(ShmError::SizeMismatch { expected: total, found: now }.into());
        }
        if present && !segment.join(deadline)? {
            return Err(OpenTry::Missing); // removed while we looked: look the name up again
        }
        Ok((segment, kind))
    }

    /// Maps every page of an opened segment into this process, so that the hot path takes
    /// no page fault. Openers call it once they have checked the size against what the
    /// segment's headers imply: [`open`](Self::open) maps without it, so a forged sparse
    /// object of a large size commits nothing but the header pages read to refuse it.
    /// Best effort: where `MADV_POPULATE_WRITE` is missing (Linux < 5.14) pages fault in on
    /// first use.
    pub(crate) fn populate(&self) {
        // SAFETY: `base`/`len` are this handle's mapping; the advice changes no contents
        // (it faults in pages the object already has: creators reserve every page).
        let _ = unsafe {
            rustix::mm::madvise(self.base.as_ptr().cast(), self.len, Advice::LinuxPopulateWrite)
        };
    }

    /// The closes of the object, by any process (how async waits and selects learn that a
    /// peer may have died): watched from the first call on.
    pub(crate) fn closes(&self) -> &std::sync::Arc<crate::wait::reactor::Closes> {
        use std::os::fd::AsFd;
        self.closes.get_or_init(|| crate::wait::reactor::Closes::watch(self.fd.as_fd()))
    }

    /// The object name, with its leading `/`.
    pub fn name(&self) -> &str {
        self.name.to_str().unwrap_or("<non-UTF-8 name>")
    }

    /// Whether another process truncated the object under this mapping and a page beyond
    /// its new end was touched: the SIGBUS that access raised was turned into a zero page
    /// (see `bus_guard`), and what the segment holds can no longer be trusted.
    pub fn truncated(&self) -> bool {
        self.guard.as_ref().is_some_and(crate::bus_guard::Guard::damaged)
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: a segment holds at least its header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether another handle (here or in another process) has the segment open.
    ///
    /// # Errors
    ///
    /// [`ShmError::Io`] if the lock cannot be probed.
    pub fn in_use_elsewhere(&self) -> Result<bool, ShmError> {
        presence_held(self.fd.as_fd())
    }

    /// Sets what the last handle out asks before removing the segment (see
    /// [`LastOut`]). Without it, the segment is never removed by its handles.
    pub(crate) fn set_last_out(&mut self, last_out: LastOut) {
        self.last_out = Some(last_out);
    }

    /// Takes the liveness lock on `byte` of the object for this handle; `false` if another
    /// open file description holds it. Locks taken through this handle never conflict with
    /// each other: callers keep track of which bytes they hold.
    pub(crate) fn lock_byte(&self, byte: u64) -> io::Result<bool> {
        lock_byte(self.fd.as_fd(), byte).map_err(io::Error::from)
    }

    /// Whether this handle is a copy a forked child inherited (made by another process
    /// than this one): its drops must not act on shared state, which its maker's handle
    /// still owns. No system call.
    pub(crate) fn inherited(&self) -> bool {
        self.pid != fork::current_pid()
    }

    /// Gives up the liveness lock on `byte`.
    pub(crate) fn unlock_byte(&self, byte: u64) {
        unlock_byte(self.fd.as_fd(), byte);
    }

    /// Whether another open file description (another handle, here or in another process)
    /// holds the liveness lock on `byte`.
    pub(crate) fn byte_held_elsewhere(&self, byte: u64) -> io::Result<bool> {
        held_elsewhere(self.fd.as_fd(), byte).map_err(io::Error::from)
    }

    /// The segment header.
    pub fn header(&self) -> &SegmentHeader {
        crate::layout::header(self)
    }

    /// A reference to the `U` at `offset`.
    ///
    /// # Panics
    ///
    /// If `U` does not fit at `offset` or is misaligned there: offsets come from
    /// [`RingLayout`](crate::layout::RingLayout) computed from checked parameters, so this is
    /// a bug in gpuring, never a consequence of what a peer wrote.
    ///
    /// # Safety
    ///
    /// `U` must be valid for any bytes a peer may write (atomics, `UnsafeCell`s of `Pod`
    /// types), and its use must follow the protocol of the structure at `offset`.
    pub(crate) unsafe fn at<U>(&self, offset: usize) -> NonNull<U> {
        let end = offset.checked_add(size_of::<U>());
        assert!(end.is_some_and(|e| e <= self.len), "offset {offset} outside the segment");
        assert!(offset % align_of::<U>() == 0, "offset {offset} misaligned");
        // SAFETY: offset + size_of::<U>() <= len, inside the mapping.
        unsafe { self.base.add(offset).cast() }
    }

    /// Whether an object named `name` exists (without mapping it).
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::Io`] (other than "not found" and "access
    /// denied", which mean "exists" for the latter).
    pub fn exists(name: &str) -> Result<bool, ShmError> {
        let cname = object_name(name)?;
        match shm::open(cname.as_c_str(), shm::OFlags::RDONLY, Mode::empty()) {
            Ok(_fd) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(Errno::ACCESS) => Ok(true),
            Err(e) => Err(io_err("shm_open")(e)),
        }
    }

    /// Removes the name `name` (with or without its leading `/`) whatever it holds and
    /// whoever uses it. Mappings stay valid. For pools whose own protocol says nothing
    /// refers to them any more; everything else goes through
    /// [`remove_if_unattended`](Self::remove_if_unattended).
    ///
    /// # Errors
    ///
    /// [`ShmError::InvalidName`], [`ShmError::NotFound`], [`ShmError::Io`].
    pub fn unlink(name: &str) -> Result<(), ShmError> {
        let cname = object_name(name)?;
        shm::unlink(cname.as_c_str()).map_err(|e| match e {
            Errno::NOENT => ShmError::NotFound { name: cname.to_string_lossy().into_owned() },
            e => io_err("shm_unlink")(e),
        })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.inherited() {
            // A forked child's copy: its parent's handle has the segment open through the
            // same file description (and locks), and decides when it goes.
        } else if self.unlink_on_drop {
            let _ = shm::unlink(self.name.as_c_str()); // a create that failed half-way
        } else if let Some(last_out) = self.last_out.take() {
            self.leave(&last_out);
        }
        // Unguarded before it is unmapped, so the guard never touches a reused range.
        drop(self.guard.take());
        // SAFETY: `base`/`len` are the mapping made in `map`; every reference into it borrows
        // from `self`, so none outlives this.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
        // The descriptor closes after this, dropping every lock this handle held.
    }
}

#[cfg(test)]
mod tests;
