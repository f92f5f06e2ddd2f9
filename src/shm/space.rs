//! Whether the shared-memory file system can hold a segment, and reserving the space.
//!
//! A segment's pages are only allocated when first touched. Without a check, a segment
//! larger than what `/dev/shm` (or memory) can hold is created fine and then kills its
//! user: a SIGBUS on the first page past the file system's limit, or the out-of-memory
//! killer. So `create` checks the size against the file system's free space and the
//! memory the kernel says is available, then reserves it (`fallocate`), and reports
//! [`ShmError::NoSpace`] instead.

use std::os::fd::OwnedFd;

use rustix::io::Errno;

use super::ShmError;
use super::error::io_err;

/// Where POSIX shared-memory objects live on Linux.
const SHM_DIR: &str = "/dev/shm";

/// Bytes a new segment can take: what the file system has free for this user, and no
/// more than the memory the kernel says is available (with swap), since tmpfs pages are
/// memory. `None` where neither can be read.
pub fn available() -> Option<u64> {
    let fs = rustix::fs::statvfs(SHM_DIR).ok().map(|s| s.f_bavail.saturating_mul(s.f_frsize));
    [fs, memory_available()].into_iter().flatten().min()
}

/// `MemAvailable + SwapFree` from `/proc/meminfo`, in bytes.
fn memory_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some(field("MemAvailable")? + field("SwapFree").unwrap_or(0))
}

/// [`ShmError::NoSpace`] if a segment of `needed` bytes cannot fit.
pub(super) fn check(needed: u64) -> Result<(), ShmError> {
    match available() {
        Some(available) if needed > available => Err(ShmError::NoSpace { needed, available }),
        _ => Ok(()),
    }
}

/// Allocates every page of the object open as `fd` (`size` bytes) now, so that running out
/// is [`ShmError::NoSpace`] here and not a SIGBUS later. File systems that cannot
/// `fallocate` are left to the check above.
pub(super) fn reserve(fd: &OwnedFd, size: u64) -> Result<(), ShmError> {
    match rustix::fs::fallocate(fd, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) | Err(Errno::OPNOTSUPP | Errno::NOSYS) => Ok(()),
        Err(Errno::NOSPC) => {
            Err(ShmError::NoSpace { needed: size, available: available().unwrap_or(0) })
        }
        Err(e) => Err(io_err("fallocate")(e)),
    }
}

/// `bytes` for people: `512 B`, `1.5 KiB`, `64.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 30), "64.0 GiB");
    }

    #[test]
    #[cfg_attr(miri, ignore = "statvfs and /proc are not available under Miri")]
    fn the_space_check_refuses_what_cannot_fit() {
        let free = available().expect("/dev/shm and /proc/meminfo are readable here");
        assert!(free > 0);
        assert!(matches!(check(free + 1), Err(ShmError::NoSpace { needed, available })
            if needed == free + 1 && available >= free / 2));
        assert!(check(4096).is_ok());
    }
}
