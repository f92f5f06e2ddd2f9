//! `gpuring bench`: the comparison suite at a quick setting, one table with ratios.

use std::time::Duration;

use crate::demo::{Figures, Transport, host_channel, stream_figures};
#[cfg(feature = "cuda")]
use crate::gpu_demo;
use crate::{Error, bytes, duration, ratio_words, say, table};

pub(crate) fn bench(
    json: bool,
    sizes: &[u64],
    samples: Option<&std::path::Path>,
) -> Result<(), Error> {
    // (payload bytes, messages streamed, ping-pongs): about 200 MB streamed per case, at
    // least 300 messages.
    let cases = sizes.iter().map(|&s| {
        let messages = (200_000_000 / s).clamp(300, 50_000);
        (s as usize, messages, (messages / 10).clamp(50, 5_000))
    });
    let mut rows: Vec<(usize, Figures, f64, f64)> = Vec::new();
    let mut skipped = Vec::new();
    // `base`: gpuring's (p50, items/s) for the row's payload.
    let mut push = |size: usize, base: (Duration, f64), f: Figures| {
        let lat = f.p50.as_secs_f64() / base.0.as_secs_f64();
        let rate = base.1 / f.per_sec;
        rows.push((size, f, lat, rate));
    };
    for (size, messages, pings) in cases {
        if let Err(why) = crate::demo::shm_fits(size) {
            skipped.push(why); // said after the table; the other sizes still run
            continue;
        }
        let g = host_channel(messages, size, pings)?;
        let p = stream_figures(Transport::Pipe, messages, size, pings, false)?;
        let u = stream_figures(Transport::Unix, messages, size, pings, false)?;
        let base = (g.p50, g.per_sec);
        push(size, base, g);
        push(size, base, p);
        push(size, base, u);
    }
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))] // set by the GPU path
    let mut gpu_setup: Option<String> = None;
    #[cfg(feature = "cuda")]
    if crate::demo::gpu_present() {
        let (g, setup, signal) = gpu_demo::channel(20_000, 4096, 2_000, false)?;
        gpu_setup = Some(setup);
        // Where the default signals by host ready flags, with events too.
        let events = if signal == gpuring::GpuReady::HostFlag {
            Some(gpu_demo::channel(20_000, 4096, 2_000, true)?.0)
        } else {
            None
        };
        let p = gpu_demo::pipe(20_000, 4096, 2_000)?;
        let base = (g.p50, g.per_sec);
        push(4096, base, g);
        if let Some(e) = events {
            push(4096, base, e);
        }
        push(4096, base, p);
    }
    if let Some(path) = samples {
        let mut csv = String::from("payload_bytes,path,one_way_ns\n");
        for (size, f, _, _) in &rows {
            for d in &f.samples {
                csv.push_str(&format!("{size},{},{}\n", f.label, d.as_nanos()));
            }
        }
        std::fs::write(path, csv)?;
    }
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|(size, f, lat, rate)| {
                serde_json::json!({
                    "payload_bytes": size,
                    "path": f.label,
                    "messages": f.messages,
                    "one_way_p50_ns": f.p50.as_nanos() as u64,
                    "one_way_p99_ns": f.p99.as_nanos() as u64,
                    "items_per_sec": f.per_sec,
                    "p50_over_gpuring_p50": lat,
                    "gpuring_items_per_sec_over_this": rate,
                })
            })
            .collect();
        say!("{}", serde_json::to_string_pretty(&out)?);
        if let Some(setup) = gpu_setup {
            eprintln!("{setup}");
        }
        return Ok(());
    }
    let mut t = table(
        "payload | path | one-way p50 | one-way p99 | items/s | gpuring's p50 | gpuring's items/s",
    );
    for (size, f, lat, rate) in &rows {
        let baseline = f.label.starts_with("gpuring");
        let vs = |words: String| if baseline { "—".to_owned() } else { words };
        t.add_row([
            bytes(*size as u64),
            f.label.clone(),
            duration(f.p50),
            duration(f.p99),
            format!("{:.0}", f.per_sec),
            vs(ratio_words(*lat, "lower", "higher")),
            vs(ratio_words(*rate, "more", "fewer")),
        ]);
    }
    say!("{t}");
    say!(
        "(one run on this machine, each row beside gpuring's for its payload; each phase stops \
         after {:.1} s, so the rows that copy every byte ran fewer messages: `--json` gives \
         each row's count)",
        crate::demo::PHASE.as_secs_f64()
    );
    for (_, f, _, _) in rows.iter().filter(|(_, f, _, _)| f.spread > 2.0) {
        say!(
            "(the p50 of {} varied {:.1}x between its five rounds: this machine is busy, so \
             take these figures as rough)",
            f.label,
            f.spread
        );
    }
    for why in &skipped {
        say!("(skipped: {why})");
    }
    if let Some(setup) = gpu_setup {
        say!("{setup}");
    }
    Ok(())
}
