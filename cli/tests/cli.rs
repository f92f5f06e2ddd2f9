//! The `gpuring` command-line tool, run as a user would.
#![cfg(not(loom))]

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use common::{ring_name, role, unique_name};
use gpuring::{Channel, SpscRing, TensorMeta};

/// The `gpuring` binary cargo built for this test; where the test binary was copied to another
/// machine (the GPU staging folder), the `gpuring` beside it.
fn gpuring_bin() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_gpuring"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let beside = exe.with_file_name("gpuring");
    assert!(beside.exists(), "no gpuring binary at {} or {}", built.display(), beside.display());
    beside
}

fn gpuring(args: &[&str]) -> Output {
    Command::new(gpuring_bin()).args(args).output().expect("run gpuring")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn demo_with_a_small_count_prints_its_table() {
    let out = gpuring(&["demo", "--host", "--messages", "3000", "--size", "1024"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "demo failed: {stderr}");
    for want in ["one-way p50", "items/s", "gpuring", "pipe", "3000", "1.0 KiB", "gpuring vs pipe"]
    {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
}

/// `gpuring bench` with its default sizes in a container's 64 MB `/dev/shm` (a tmpfs of
/// that size in a mount namespace of its own, `unshare -Urm`; skipped, saying so, where
/// that cannot be made): the sizes that fit run, the one that does not is named with the
/// way out, and no ratio reads "0.0x".
#[test]
fn bench_runs_in_a_64_mb_dev_shm_and_says_what_it_skipped() {
    const NO_TMPFS: i32 = 97;
    let script =
        format!("mount -t tmpfs -o size=64m tmpfs /dev/shm || exit {NO_TMPFS}; exec \"$0\" bench");
    let out =
        Command::new("unshare").args(["-Urm", "sh", "-c", &script]).arg(gpuring_bin()).output();
    let out = match out {
        Ok(o) if o.status.code() == Some(NO_TMPFS) => {
            return eprintln!("SKIPPED: cannot mount a tmpfs in a user namespace here");
        }
        Ok(o) => o,
        Err(e) => return eprintln!("SKIPPED: no `unshare` here ({e})"),
    };
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "bench in 64 MB failed: {stderr}\n{stdout}");
    for want in ["4.0 KiB", "5.0 MB", "(skipped: 54.0 MB messages need", "--shm-size"] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
    // No ratio of zero (" 0.0x"; "10.0x lower" is a fine ratio that contains "0.0x").
    assert!(!stdout.contains(" 0.0x"), "{stdout}");
}

#[test]
fn bench_json_has_a_row_per_path_with_ratios() {
    let out = gpuring(&["bench", "--json", "--sizes", "4096"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "bench failed: {stderr}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).expect("JSON");
    let paths: Vec<&str> = rows.iter().filter_map(|r| r["path"].as_str()).collect();
    for want in ["gpuring", "pipe", "unix socket"] {
        assert!(paths.contains(&want), "no {want} row in {paths:?}");
    }
    let gpuring = rows.iter().find(|r| r["path"] == "gpuring").unwrap();
    assert_eq!(gpuring["p50_over_gpuring_p50"].as_f64(), Some(1.0));
    assert!(rows.iter().all(|r| r["items_per_sec"].as_f64().is_some_and(|v| v > 0.0)));
    assert!(rows.iter().all(|r| r["payload_bytes"] == 4096));
}

#[test]
fn inspect_shows_capacity_depth_and_pools() {
    let name = unique_name("cli-inspect");
    let ch = Channel::builder(&name).capacity(64).slots(4, 256).create().unwrap();
    let tx = ch.sender().unwrap();
    for _ in 0..3 {
        tx.send(tx.acquire().unwrap(), TensorMeta::bytes(16)).unwrap();
    }
    let out = gpuring(&["inspect", &name]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "inspect failed: {stderr}");
    assert!(stdout.contains("SpscChannel"), "{stdout}");
    assert!(stdout.contains("capacity 64"), "{stdout}");
    assert!(stdout.contains("depth 3"), "{stdout}");
    assert!(stdout.contains(&format!("pid {} (alive)", std::process::id())), "{stdout}");
    assert!(stdout.contains("dies holding it goes to another receiver"), "{stdout}");
    // The pool row: host slots (no ready signal), 4 slots, 1 free, 3 in flight.
    let cells = pool_cells(&stdout, tx.pool_name());
    assert_eq!(&cells[3..11], ["host", "-", "4", "256 B", "1", "0", "3", "0"], "{cells:?}");

    // A sender waiting for a free slot (the last one leased, the others in flight) shows.
    let waiter = std::thread::spawn(move || {
        let last = tx.acquire().unwrap();
        let next = tx.acquire_timeout(Duration::from_secs(20)).unwrap(); // sleeps: none free
        drop((last, next));
    });
    let mut stdout = String::new();
    for _ in 0..500 {
        stdout = text(&gpuring(&["inspect", &name])).0;
        if stdout.contains("1 sender for a free slot") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(stdout.contains("1 sender for a free slot"), "{stdout}");
    let rx = ch.receiver().unwrap();
    drop(rx.recv().unwrap()); // a slot goes back: the waiting sender takes it
    waiter.join().unwrap();
}

/// Senders with slots of their own (`Channel::sender_with_slots`): `inspect` shows each
/// pool's slots as its table entry records them, not the channel's.
#[test]
fn inspect_shows_each_senders_own_slots() {
    let name = unique_name("cli-own-slots");
    let ch = Channel::builder(&name).mpmc().capacity(64).slots(4, 256).create().unwrap();
    let (usual, own) = (ch.sender().unwrap(), ch.sender_with_slots(2, 1 << 20).unwrap());
    own.send(own.acquire().unwrap(), TensorMeta::bytes(16)).unwrap();
    let (stdout, stderr) = text(&gpuring(&["inspect", &name]));
    let cells = pool_cells(&stdout, usual.pool_name());
    assert_eq!(&cells[3..7], ["host", "-", "4", "256 B"], "{cells:?}{stderr}");
    let cells = pool_cells(&stdout, own.pool_name());
    assert_eq!(&cells[3..7], ["host", "-", "2", "1.0 MiB"], "{cells:?}");
    assert_eq!(&cells[7..10], ["1", "0", "1"], "one free, one in flight: {cells:?}");
}

/// A broadcast channel: `inspect` shows each receiver and how far behind it is, `list` how
/// many there are and the slowest.
#[test]
fn inspect_and_list_show_a_broadcast_channels_receivers() {
    let name = unique_name("cli-broadcast");
    let ch = Channel::builder(&name).broadcast().capacity(8).slots(4, 256).create().unwrap();
    let tx = ch.sender().unwrap();
    let (a, _b) = (ch.receiver().unwrap(), ch.receiver().unwrap());
    for _ in 0..3 {
        tx.send(tx.acquire().unwrap(), TensorMeta::bytes(16)).unwrap();
    }
    drop(a.recv().unwrap());
    let (stdout, stderr) = text(&gpuring(&["inspect", &name]));
    assert!(stdout.contains("BroadcastChannel"), "{stdout}{stderr}");
    assert!(stdout.contains("the slowest reader holds the producer back"), "{stdout}");
    assert!(stdout.contains("reader pid") && stdout.contains("at 1: 2 behind"), "{stdout}");
    assert!(stdout.contains("at 0: 3 behind"), "{stdout}");
    let (stdout, _) = text(&gpuring(&["list"]));
    let line = stdout.lines().find(|l| l.contains(&name)).expect("listed");
    assert!(line.contains("in use; 2 readers, slowest 3 behind"), "{line}");
}

#[test]
fn inspect_says_what_becomes_of_a_dead_receivers_messages() {
    let name = unique_name("cli-delivery");
    let _ch = Channel::builder(&name).redeliver(false).mpmc().create().unwrap();
    let (stdout, stderr) = text(&gpuring(&["inspect", &name]));
    assert!(
        stdout.contains("delivery  a message whose receiver dies holding it is dropped"),
        "{stdout}{stderr}"
    );
}

/// The cells of `inspect`'s table row for pool segment `pool` (its name starts with '/').
fn pool_cells(stdout: &str, pool: &str) -> Vec<String> {
    let row = stdout.lines().find(|l| l.contains(&pool[1..]));
    let row = row.unwrap_or_else(|| panic!("no row for pool {pool} in:\n{stdout}"));
    let cells = row.split(['│', '┆']).map(str::trim).filter(|c| !c.is_empty());
    cells.map(str::to_owned).collect()
}

#[test]
fn bad_arguments_and_missing_segments_are_one_line_errors() {
    let out = gpuring(&["inspect"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Usage"), "{stderr}");
    let out = gpuring(&["inspect", "gpuring-cli-no-such-segment"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // One parser for sizes: the same refusal, the same exit status, for both commands.
    for args in [["demo", "--size", "2"], ["bench", "--sizes", "4096,2"], ["demo", "--size", "5X"]]
    {
        let out = gpuring(&args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?} is a usage error: {stderr}");
        assert!(stderr.contains("--size"), "{stderr}");
    }
    let out = gpuring(&["demo", "--messages", "0"]);
    assert_eq!(out.status.code(), Some(2), "at least one message");
    // Slots beyond what /dev/shm holds: refused before anything is written, in one line.
    let out = gpuring(&["demo", "--host", "--size", "200G", "--messages", "10"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("of /dev/shm") && stderr.contains("--shm-size"), "{stderr}");
    let help = text(&gpuring(&["bench", "--help"])).0;
    assert!(help.contains("[default: 4096,5000000,54000000]"), "{help}");
}

#[test]
fn a_closed_stdout_ends_the_tool_quietly() {
    let name = unique_name("cli-pipe");
    let _ring = SpscRing::<u64>::builder(&name).capacity(8).create().unwrap();
    for args in [vec!["inspect", name.as_str()], vec!["list"]] {
        let mut child = Command::new(gpuring_bin())
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader goes away before the tool writes
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?}: quiet, not {stderr}");
    }
}

#[test]
fn list_tells_in_use_from_left_over_and_clean_removes_only_what_nobody_uses() {
    let test = "list_tells_in_use_from_left_over_and_clean_removes_only_what_nobody_uses";
    if let Some(r) = role() {
        let ring = SpscRing::<u64>::builder(ring_name()).capacity(8).create().unwrap();
        if r == "queued" {
            let mut tx = ring.producer().unwrap();
            tx.push(1).unwrap();
            tx.push(2).unwrap();
        }
        common::announce("ready");
        std::thread::sleep(Duration::from_secs(600)); // killed long before
        return;
    }
    // Two creators killed (no destructor runs): one leaves an empty ring, one a ring with
    // two elements waiting.
    let (dead, queued) = (unique_name("cli-dead"), unique_name("cli-queued"));
    for (name, r) in [(&dead, "dead"), (&queued, "queued")] {
        let mut peer = common::Peer::spawn(test, r, name);
        peer.expect("ready");
        peer.child.kill().unwrap();
        peer.child.wait().unwrap();
    }
    let path = |n: &str| format!("/dev/shm/{n}");
    assert!(std::fs::metadata(path(&dead)).is_ok(), "a killed creator leaves its segment");

    let live = unique_name("cli-live");
    let _ring = SpscRing::<u64>::builder(&live).capacity(8).create().unwrap();
    let out = gpuring(&["list"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let line = |n: &str| stdout.lines().find(|l| l.contains(n)).unwrap_or_default().to_owned();
    assert!(line(&dead).contains("left over"), "{stdout}");
    assert!(line(&queued).contains("waiting: 2 queued"), "{stdout}");
    assert!(line(&live).contains("in use"), "{stdout}");

    // Only this test's segments: others on this machine are none of its business.
    let prefix = "gpuring-test-cli-";
    let out = gpuring(&["clean", "--dry-run", prefix]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains(&format!("would remove {dead}")), "{stdout}");
    let removes = |n: &str| stdout.lines().any(|l| l.contains("remove") && l.contains(n));
    assert!(!removes(&live) && !removes(&queued), "{stdout}");
    assert!(std::fs::metadata(path(&dead)).is_ok(), "a dry run removes nothing");

    let out = gpuring(&["clean", prefix]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(stdout.contains(&format!("removed {dead}")), "{stdout}");
    // What it left, and the way out.
    let left = format!("left {queued}: 2 elements waiting for a consumer");
    assert!(stdout.contains(&left) && stdout.contains("--queued"), "{stdout}");
    assert!(stdout.contains(&format!("left {live}: in use")), "{stdout}");
    assert!(std::fs::metadata(path(&dead)).is_err(), "the left-over segment is gone");
    assert!(std::fs::metadata(path(&queued)).is_ok(), "elements waiting: kept");
    assert!(std::fs::metadata(path(&live)).is_ok(), "the one in use stays");

    let out = gpuring(&["clean", "--queued", prefix]);
    let (stdout, _) = text(&out);
    assert!(stdout.contains(&format!("removed {queued}: 2 queued")), "{stdout}");
    assert!(std::fs::metadata(path(&queued)).is_err(), "--queued drops what waited");
    assert!(std::fs::metadata(path(&live)).is_ok(), "the one in use stays");
}

/// On a GPU machine, `demo --gpu` says which GPU setup its hand-offs took: both processes on
/// one GPU, time-sliced without an MPS daemon (with the hint to start one), or sharing it
/// through MPS (no hint). Whether a daemon runs is read here from its control pipe, not
/// from the driver attribute the tool uses. It also runs the GPU path with host ready flags.
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_demo_says_whether_the_gpu_is_time_sliced_or_shared_through_mps() {
    let pipe_dir = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or("/tmp/nvidia-mps".into());
    let mps = std::path::Path::new(&pipe_dir).join("control").exists();
    let out = gpuring(&["demo", "--gpu", "--messages", "2000", "--size", "4096"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "demo failed: {stderr}");
    let setup = stdout.lines().find(|l| l.starts_with("GPU setup: ")).expect(&stdout);
    println!("MPS daemon running: {mps}; {setup}");
    if mps {
        assert!(setup.contains("sharing it through CUDA MPS"), "{setup}");
        assert!(!setup.contains("nvidia-cuda-mps-control"), "no hint under MPS: {setup}");
    } else {
        assert!(setup.contains("time-slices their contexts"), "{setup}");
        assert!(setup.contains("nvidia-cuda-mps-control -d"), "the hint: {setup}");
    }
    // The GPU path ran a second time with host ready flags (the H100 and H200 have the
    // stream memory operations they need), and the demo compares the two.
    assert!(stdout.contains("gpuring (GPU, host flags)"), "no host-flag row in:\n{stdout}");
    let vs = stdout.lines().find(|l| l.starts_with("host ready flags")).expect(&stdout);
    println!("{vs}");
    assert!(vs.contains("vs events"), "{vs}");
}

/// On a GPU machine, `inspect` of a GPU channel ends with a line per GPU saying what a
/// sender and a receiver both on it would get: time-sliced (with the hint to start MPS) or
/// shared through MPS, as read here from the MPS control pipe. Its pool table says how each
/// sender signals a send: "events" here, "host flags" for a channel whose senders chose
/// `GpuReady::HostFlag`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU (run on the GPU machine by .gpu/run.sh)"]
fn gpu_inspect_of_a_gpu_channel_says_each_gpus_mps_state() {
    let pipe_dir = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or("/tmp/nvidia-mps".into());
    let mps = std::path::Path::new(&pipe_dir).join("control").exists();
    let stream = gpuring::cuda::context(0).unwrap().new_stream().unwrap();
    let name = unique_name("cli-gpu-inspect");
    let ch = Channel::builder(&name).slots(2, 4096).cuda(&stream).create().unwrap();
    let tx = ch.sender().unwrap(); // a device pool in the table
    let out = gpuring(&["inspect", &name]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "inspect failed: {stderr}");
    let gpu0 = stdout.lines().find(|l| l.starts_with("gpu ") && l.contains("GPU 0 ("));
    let gpu0 = gpu0.unwrap_or_else(|| panic!("no line for GPU 0 in:\n{stdout}"));
    println!("MPS daemon running: {mps}; {gpu0}");
    if mps {
        assert!(gpu0.contains("sharing it through CUDA MPS"), "{gpu0}");
    } else {
        assert!(gpu0.contains("time-slices") && gpu0.contains("nvidia-cuda-mps-control -d"));
    }
    // The default signal (host flags where the device can), as the sender reports it.
    let default = match tx.ready_signal() {
        gpuring::GpuReady::HostFlag => "host flags",
        gpuring::GpuReady::Event => "events",
    };
    assert_eq!(&pool_cells(&stdout, tx.pool_name())[3..5], ["cuda", default]);
    let evented = unique_name("cli-gpu-inspect-events");
    let ch2 = Channel::builder(&evented).slots(2, 4096).cuda(&stream);
    let ch2 = ch2.ready(gpuring::GpuReady::Event).create().unwrap();
    let tx2 = ch2.sender().unwrap();
    let out = gpuring(&["inspect", &evented]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "inspect failed: {stderr}");
    let cells = pool_cells(&stdout, tx2.pool_name());
    println!("{cells:?}");
    assert_eq!(&cells[3..5], ["cuda", "events"], "{cells:?}");
}
