//! The process probe: what `/proc` says of a pid. Pids are reused, so this is for what only
//! a pid names (a tool's view of a pool's owner; whether a dead receiver's process has
//! gone, with its GPU context; whether the holder of a liveness lock has begun to exit).

/// What the process table says of a pid. Pids are reused, so this is for what only a pid
/// names (a tool's view of a pool's owner; whether a dead receiver's process has gone, with
/// its GPU context); liveness of attached endpoints is judged by their locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// A process with this pid runs (it may be another process than the one recorded).
    Running,
    /// It has begun to exit (the kernel's `PF_EXITING`): it runs no more of its own code,
    /// but still holds its files (and their locks) and, with a GPU context, its device
    /// work, until the kernel has finished with it, which can take seconds on a GPU.
    Exiting,
    /// No process has this pid, or it is a zombie: its files (and a GPU context) are gone.
    Exited,
    /// The pid cannot name a process (0, or beyond what the kernel hands out: a forged
    /// value), or `/proc` could not be read.
    Unknown,
}

/// The state of process `pid`, from `/proc/<pid>/stat`: `Exiting` only once every thread
/// of it has begun to exit (`/proc/<pid>/task/*/stat`, read only then), so that a main
/// thread that ended alone (`pthread_exit`) while others run is no exiting process. Reads
/// files: slow paths only (no heap allocation: a receiver waiting for a host ready flag
/// asks it while it naps).
pub fn process_state(pid: u32) -> ProcessState {
    // A pid read from shared memory may be forged: 0 names nobody, and a value above
    // `i32::MAX` no process.
    if pid == 0 || i32::try_from(pid).is_err() {
        return ProcessState::Unknown;
    }
    let mut buf = [0u8; 48];
    let Some(path) = proc_path(&mut buf, pid, None, b"stat") else {
        return ProcessState::Unknown;
    };
    match stat_of(path) {
        ProcessState::Exiting if !every_thread_exiting(pid) => ProcessState::Running,
        state => state,
    }
}

/// `/proc/<pid>/<file>`, or `/proc/<pid>/task/<tid>/<file>`, built in `buf`.
fn proc_path<'a>(
    buf: &'a mut [u8; 48],
    pid: u32,
    tid: Option<&[u8]>,
    file: &[u8],
) -> Option<&'a str> {
    let mut digits = [0u8; 10];
    let pid = itoa(pid, &mut digits);
    let parts: [&[u8]; 4] = match tid {
        Some(tid) => [b"/proc/", pid, b"/task/", tid],
        None => [b"/proc/", pid, b"", b""],
    };
    let mut at = 0;
    for part in parts.into_iter().chain([b"/".as_slice(), file]) {
        buf.get_mut(at..at + part.len())?.copy_from_slice(part);
        at += part.len();
    }
    std::str::from_utf8(&buf[..at]).ok()
}

/// The state one stat file gives (a task that is gone has exited).
fn stat_of(path: &str) -> ProcessState {
    read_stat(path, ProcessState::Exited, ProcessState::Unknown, parse_stat)
}

/// Reads the `stat` file at `path` and gives `parse` of its first bytes (the state and
/// flags come within them: a command name is at most 64 bytes); `gone` when the task no
/// longer exists, `unreadable` when the file cannot be read.
fn read_stat<R>(path: &str, gone: R, unreadable: R, parse: impl FnOnce(&[u8]) -> R) -> R {
    let fd = match rustix::fs::open(path, rustix::fs::OFlags::RDONLY, rustix::fs::Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::SRCH) => return gone,
        Err(_) => return unreadable,
    };
    let mut buf = [0u8; 256];
    match rustix::io::read(&fd, &mut buf) {
        Ok(n) => parse(&buf[..n]),
        Err(rustix::io::Errno::SRCH) => gone,
        Err(_) => unreadable,
    }
}

/// Whether every thread of `pid` is done with its code: gone, begun to exit, or asleep in
/// the kernel with a SIGKILL pending (one blocked in a driver call when its process was
/// killed, which never returns to it); `false` when one runs on or cannot be read.
///
/// A thread with a SIGKILL pending that is running (`R`) may still run its own code until
/// the kill's interrupt reaches its CPU, which on a VM whose vCPU the hypervisor has
/// descheduled takes a while: an MPMC consumer there finished freeing a cell that an
/// adopter had just taken over on the strength of its death, and the adopter read the
/// next lap's element from it (the GPU kill storms' rare `Corrupted`). So the pending
/// signal is read first and the thread's state after it: asleep then (`S`, `D`, stopped),
/// it is in the kernel with the kill pending, and never returns to its code.
fn every_thread_exiting(pid: u32) -> bool {
    use std::mem::MaybeUninit;
    let mut buf = [0u8; 48];
    let Some(dir_path) = proc_path(&mut buf, pid, None, b"task") else { return false };
    let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY;
    let Ok(fd) = rustix::fs::open(dir_path, flags, rustix::fs::Mode::empty()) else {
        return false;
    };
    let mut entries = [MaybeUninit::<u8>::uninit(); 2048];
    let mut dir = rustix::fs::RawDir::new(fd, &mut entries);
    while let Some(entry) = dir.next() {
        let Ok(entry) = entry else { return false };
        let tid = entry.file_name().to_bytes();
        if tid.starts_with(b".") {
            continue;
        }
        let mut buf = [0u8; 48];
        let Some(path) = proc_path(&mut buf, pid, Some(tid), b"stat") else { return false };
        let done = match stat_of(path) {
            ProcessState::Exiting | ProcessState::Exited => true,
            ProcessState::Running => {
                let mut status = [0u8; 48];
                proc_path(&mut status, pid, Some(tid), b"status").is_some_and(kill_pending)
                    && killed_in_kernel(path)
            }
            ProcessState::Unknown => false,
        };
        if !done {
            return false;
        }
    }
    true
}

/// For a thread seen with a SIGKILL pending: whether its `stat` (at `path`, read now,
/// after the pending signal) says it is done with its code: asleep in the kernel, stopped,
/// exiting or gone.
fn killed_in_kernel(path: &str) -> bool {
    read_stat(path, true, false, off_cpu_or_exiting)
}

/// Whether a `stat` line says its task is asleep in the kernel (`S`, `D`), stopped (`T`,
/// `t`), exiting or gone: anything but running (`R`) or unreadable.
fn off_cpu_or_exiting(stat: &[u8]) -> bool {
    match state_and_flags(stat) {
        Some((b"Z" | b"X", _)) => true,
        Some((_, Some(flags))) if flags & PF_EXITING != 0 => true,
        Some((state, _)) => matches!(state, b"S" | b"D" | b"T" | b"t"),
        None => false,
    }
}

/// SIGKILL's bit in a `SigPnd` mask (signal 9).
const SIGKILL_BIT: u64 = 1 << 8;

/// Whether the task whose `status` file is at `path` has a SIGKILL pending (`SigPnd`).
fn kill_pending(path: &str) -> bool {
    let Ok(fd) = rustix::fs::open(path, rustix::fs::OFlags::RDONLY, rustix::fs::Mode::empty())
    else {
        return false;
    };
    // `SigPnd` comes some 1–1.5 KB in (after the ids, groups and memory lines).
    let mut buf = [0u8; 4096];
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(&fd, &mut buf[n..]) {
            Ok(0) => break,
            Ok(read) => n += read,
            Err(_) => return false,
        }
    }
    sig_pending(&buf[..n]) & SIGKILL_BIT != 0
}

/// The `SigPnd` mask of a `status` file's text (0 when it has none).
fn sig_pending(status: &[u8]) -> u64 {
    status
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"SigPnd:"))
        .and_then(|hex| std::str::from_utf8(hex).ok())
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0)
}

/// The kernel's flag of a task that has begun to exit (`include/linux/sched.h`).
const PF_EXITING: u64 = 0x4;

/// The state a `/proc/<pid>/stat` line gives: `pid (comm) S ppid pgrp session tty tpgid
/// flags ...`. The state follows the last ')' (a command name may hold any byte); the
/// numbers after it hold none.
fn parse_stat(stat: &[u8]) -> ProcessState {
    match state_and_flags(stat) {
        Some((b"Z" | b"X", _)) => ProcessState::Exited,
        Some((_, Some(flags))) if flags & PF_EXITING != 0 => ProcessState::Exiting,
        Some(_) => ProcessState::Running,
        None => ProcessState::Unknown,
    }
}

/// The state field of a `stat` line, and its flags if the line reaches them.
fn state_and_flags(stat: &[u8]) -> Option<(&[u8], Option<u64>)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let mut fields = stat[close + 1..].split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
    let state = fields.next()?;
    let flags = fields.nth(5).and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok());
    Some((state, flags))
}

/// `n` in decimal, in `buf`'s tail.
fn itoa(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Found by the scribbler test: a forged pid above `i32::MAX` became a negative pid
    /// (a process group for `kill`), and tripped a debug assertion in rustix.
    #[test]
    #[cfg_attr(miri, ignore = "/proc is not available under Miri")]
    fn the_probe_refuses_pids_that_cannot_exist() {
        assert_eq!(process_state(0), ProcessState::Unknown);
        assert_eq!(process_state(u32::MAX), ProcessState::Unknown);
        assert_eq!(process_state(1 << 31), ProcessState::Unknown);
        assert_eq!(process_state(std::process::id()), ProcessState::Running);
    }

    /// A task that has begun to exit is told apart from one that runs: what a GPU process
    /// shows for seconds after SIGKILL, holding its locks.
    #[test]
    fn the_stat_line_says_exiting_running_or_exited() {
        let line = |state: &str, flags: u64| {
            format!("4242 (a (b) c) {state} 1 4242 4242 0 -1 {flags} 12 0 0 0 5 3 0 0 20 0 3")
        };
        assert_eq!(parse_stat(line("R", 0x400100).as_bytes()), ProcessState::Running);
        assert_eq!(parse_stat(line("D", 0x400104).as_bytes()), ProcessState::Exiting);
        assert_eq!(parse_stat(line("R", 0x40840c).as_bytes()), ProcessState::Exiting);
        assert_eq!(parse_stat(line("Z", 0x40840c).as_bytes()), ProcessState::Exited);
        assert_eq!(parse_stat(b"4242 (x) S"), ProcessState::Running, "flags cut off");
        assert_eq!(parse_stat(b"4242 (x"), ProcessState::Unknown);
        // A thread with a SIGKILL pending counts as done only off its CPU: running, it
        // may still run its own code until the kill's interrupt reaches it.
        assert!(!off_cpu_or_exiting(line("R", 0x400100).as_bytes()));
        assert!(off_cpu_or_exiting(line("S", 0x400100).as_bytes()));
        assert!(off_cpu_or_exiting(line("D", 0x400100).as_bytes()));
        assert!(off_cpu_or_exiting(line("R", 0x400104).as_bytes()), "exiting");
        assert!(off_cpu_or_exiting(line("Z", 0).as_bytes()));
        assert!(!off_cpu_or_exiting(b"4242 (x"));
    }

    /// This process runs, with more than one thread: not every thread exits.
    #[test]
    #[cfg_attr(miri, ignore = "/proc is not available under Miri")]
    fn a_running_process_has_threads_that_do_not_exit() {
        let t = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(200)));
        assert!(!every_thread_exiting(std::process::id()));
        let mut buf = [0u8; 48];
        let tid = b"1";
        assert_eq!(proc_path(&mut buf, 42, Some(tid), b"stat"), Some("/proc/42/task/1/stat"));
        let status = "Name:\tx\nSigQ:\t0/1\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n";
        assert_eq!(sig_pending(status.as_bytes()) & SIGKILL_BIT, SIGKILL_BIT);
        assert_eq!(sig_pending(b"Name:\tx\nSigPnd:\t0000000000004000\n"), 0x4000);
        let mut buf = [0u8; 48];
        let own = proc_path(&mut buf, std::process::id(), None, b"status").unwrap();
        assert!(!kill_pending(own), "no SIGKILL pending here");
        t.join().unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "processes are not available under Miri")]
    fn the_probe_sees_a_zombie_and_a_reaped_child_as_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited. On its way there it may be seen
        // `Exiting` (its flags say so before its state turns `Z`), which is no end state.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut state = process_state(pid);
        while matches!(state, ProcessState::Running | ProcessState::Exiting) {
            assert!(std::time::Instant::now() < deadline, "`true` did not exit: {state:?}");
            std::thread::sleep(Duration::from_millis(1));
            state = process_state(pid);
        }
        assert_eq!(state, ProcessState::Exited, "a zombie has exited");
        child.wait().unwrap();
        assert_eq!(process_state(pid), ProcessState::Exited, "reaped");
    }
}
