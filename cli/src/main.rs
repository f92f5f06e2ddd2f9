//! `gpuring`: see what the rings do, and what they cost next to a pipe.
//!
//! | file | command |
//! |---|---|
//! | `demo.rs` | `demo` (and the peer processes it starts) |
//! | `gpu_demo.rs` | the demo's GPU path (feature `cuda`) |
//! | `bench.rs` | `bench` |
//! | `show.rs` | `inspect`, `list`, `clean` |
//!
//! ```text
//! gpuring demo [--host | --gpu] [--messages N] [--size BYTES]
//! gpuring inspect NAME
//! gpuring list
//! gpuring clean [--dry-run] [--queued] [PREFIX]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod bench;
mod demo;
#[cfg(feature = "cuda")]
mod gpu_demo;
mod show;

type Error = Box<dyn std::error::Error>;

/// `println!` for the tool's output. A reader that closed our stdout (`gpuring list |
/// head`) ends the program quietly with exit status 0, as other tools do, instead of a
/// panic; any other failure to write is a one-line error, exit status 1.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            $crate::stdout_failed(e);
        }
    }};
}
pub(crate) use say;

/// What a failed write to stdout ends in (see [`say!`]).
pub(crate) fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("gpuring: writing to stdout: {e}");
    std::process::exit(1);
}

/// The one parser of payload sizes (`--size`, `--sizes`): bytes as a number (`4096`,
/// `54_000_000`) or with a unit: `K`/`KiB`, `M`/`MiB`, `G`/`GiB` (powers of 1024), `kB`,
/// `MB`, `GB` (powers of 1000). From 8 bytes (a message carries its sequence number) to
/// the largest slot (256 GiB); whether `/dev/shm` can hold the slots is checked when they
/// are made (`NoSpace`).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim().replace('_', "");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use K, M, G, KiB, MiB, GiB, kB, MB or GB)"
            ));
        }
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size in bytes"))?;
    let bytes = n.checked_mul(scale).ok_or_else(|| format!("{s} is too large"))?;
    const MAX: u64 = gpuring::MAX_SLOT_SIZE;
    if !(8..=MAX).contains(&bytes) {
        return Err(format!("{bytes} bytes is outside 8 B..=256 GiB (one slot)"));
    }
    Ok(bytes)
}

#[derive(Parser)]
#[command(
    name = "gpuring",
    version,
    about = "Zero-copy hand-off between processes: demo and tools"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Two processes hand off messages through a gpuring channel (GPU slots when a GPU is
    /// present, host slots otherwise), then through a pipe; prints both.
    Demo {
        /// Host slots, even on a GPU machine.
        #[arg(long, conflicts_with = "gpu")]
        host: bool,
        /// GPU slots (fails without a CUDA device).
        #[arg(long)]
        gpu: bool,
        /// Messages streamed one way for the throughput figure (at least 1).
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
        messages: u64,
        /// Payload bytes per message: a number, or with a unit (64K, 5M, 54MB).
        #[arg(long, default_value = "4096", value_parser = parse_size)]
        size: u64,
    },
    /// The comparison suite at a quick setting: gpuring channels against a pipe and a Unix
    /// socket carrying 4 KB, 5 MB and 54 MB payloads (plus the GPU path when a GPU is
    /// present), one table with ratios. `cargo bench` runs the full criterion suites.
    Bench {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Payload sizes, comma-separated: numbers of bytes, or with units (64K, 5M, 54MB).
        #[arg(long, value_delimiter = ',', default_value = "4096,5000000,54000000", value_parser = parse_size)]
        sizes: Vec<u64>,
        /// Also write every one-way latency sample to this CSV file (payload, path,
        /// nanoseconds), for `scripts/plot_latency.py`.
        #[arg(long)]
        samples: Option<std::path::PathBuf>,
    },
    /// Show a segment: kind, ring positions and depth, waiters, roles, pools and slots.
    Inspect {
        /// Segment name (as created; a leading `/` is optional).
        name: String,
    },
    /// gpuring segments on this machine, and whether a process uses them.
    List,
    /// Remove what no process uses: segments left by a crash with nothing queued, and
    /// orphaned pools (never a segment in use).
    Clean {
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// Also remove rings and channels that no process has open although elements wait
        /// in them for a consumer that has not come (they are dropped).
        #[arg(long)]
        queued: bool,
        /// Only segments whose names start with this.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// (internal) the demo's second process.
    #[command(hide = true)]
    Peer { role: String, name: String, size: usize },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Demo { host, gpu, messages, size } => demo::demo(host, gpu, messages, size as usize),
        Cmd::Bench { json, sizes, samples } => bench::bench(json, &sizes, samples.as_deref()),
        Cmd::Inspect { name } => show::inspect(&name),
        Cmd::List => show::list(),
        Cmd::Clean { dry_run, queued, prefix } => show::clean(dry_run, queued, &prefix),
        Cmd::Peer { role, name, size } => demo::peer(&role, &name, size),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuring: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A table with the tool's look and the columns named in `header`, separated by `|`.
pub(crate) fn table(header: &str) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_header(header.split('|').map(str::trim));
    t
}

/// `n` bytes in the units the sizes are given in (`parse_size`): a multiple of 1000 that
/// is not one of 1024 (`54MB`, `5000000`) in powers of 1000 (`54.0 MB`), anything else in
/// powers of 1024 (`4.0 KiB`, `54.0 MiB` for `54M`).
pub(crate) fn bytes(n: u64) -> String {
    const BINARY: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    const DECIMAL: [(u64, &str); 3] = [(1_000_000_000, "GB"), (1_000_000, "MB"), (1_000, "kB")];
    let units = if n % 1000 == 0 && n % 1024 != 0 { DECIMAL } else { BINARY };
    match units.iter().find(|&&(u, _)| n >= u) {
        Some(&(u, name)) => format!("{:.1} {name}", n as f64 / u as f64),
        None => format!("{n} B"),
    }
}

/// A ratio for people, never "0.0x": `r` (how many times better) as "N× {better}" when it
/// is at least 1, else as "N× {worse}" of its inverse. "3.2x" below 10, "95x" above.
pub(crate) fn ratio_words(r: f64, better: &str, worse: &str) -> String {
    let (r, word) = if r >= 1.0 { (r, better) } else { (1.0 / r, worse) };
    if r < 10.0 { format!("{r:.1}x {word}") } else { format!("{r:.0}x {word}") }
}

/// `ours` against `theirs` where less is better (latencies): "N× lower" or "N× higher".
pub(crate) fn lower_or_higher(ours: Duration, theirs: Duration) -> String {
    ratio_words(theirs.as_secs_f64() / ours.as_secs_f64(), "lower", "higher")
}

/// `ours` against `theirs` where more is better (rates): "N× more" or "N× fewer".
pub(crate) fn more_or_fewer(ours: f64, theirs: f64) -> String {
    ratio_words(ours / theirs, "more", "fewer")
}

pub(crate) fn duration(d: Duration) -> String {
    if d < Duration::from_micros(10) {
        format!("{} ns", d.as_nanos())
    } else if d < Duration::from_millis(10) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    }
}
