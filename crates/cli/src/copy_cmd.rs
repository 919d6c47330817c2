//! `fabrickv copy`: pull a shard from a server into a directory (the
//! target side of the copy; the source is any `fabrickv serve --shard`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fabrickv_copy::{copy, CopyOptions, Event, COPY_PARALLELISM_DEFAULT, COPY_RANGES_DEFAULT};
use fabrickv_types::size::parse_size;

#[derive(Args)]
pub struct CopyArgs {
    /// The source server's native address (it serves the shard with
    /// `serve --shard NAME=PATH`).
    #[arg(long)]
    from: String,
    /// The shard's name on the source.
    #[arg(long)]
    shard: String,
    /// The target directory: new, empty, or an earlier copy's.
    #[arg(long)]
    to: PathBuf,
    /// Ranges the source splits the shard into (balanced by sampled key
    /// and value sizes).
    #[arg(long, default_value_t = COPY_RANGES_DEFAULT)]
    ranges: u32,
    /// Data streams: ranges copied at once.
    #[arg(long, default_value_t = COPY_PARALLELISM_DEFAULT)]
    parallelism: u16,
    /// Continue an interrupted copy from each range's last durable
    /// position (without it, an interrupted copy starts over).
    #[arg(long)]
    resume: bool,
    /// Bound on connecting to the source, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    connect_timeout_ms: u64,
    /// Bound on each control call and on a silent data stream, in
    /// milliseconds.
    #[arg(long, default_value_t = 30_000)]
    op_timeout_ms: u64,
    /// Bytes of a range loaded between durable positions (the granularity
    /// of --resume), e.g. 256MB.
    #[arg(long, default_value = "256MB")]
    durable_every: String,
    /// Skip the final scan that checks the copy's digest.
    #[arg(long)]
    no_verify: bool,
    /// Keep the copy's pages in the page cache (by default each durable
    /// load's pages are dropped, and the verification reads the disk).
    #[arg(long)]
    keep_cached: bool,
    /// Write a PNG of the copy rate over time to this file (needs a
    /// binary built with the `bench` feature, as `make build` does).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Print the result as one JSON line too.
    #[arg(long)]
    json: bool,
}

pub fn run(a: CopyArgs) -> Result<ExitCode, String> {
    // Refused before the copy starts, not after it is done.
    if a.plot.is_some() && !cfg!(feature = "bench") {
        return Err(PLOT_WITHOUT_BENCH.into());
    }
    let mut opts = CopyOptions::new(&a.from, &a.shard, &a.to);
    opts.ranges = a.ranges;
    opts.parallelism = a.parallelism;
    opts.resume = a.resume;
    opts.connect_timeout = Duration::from_millis(a.connect_timeout_ms);
    opts.op_timeout = Duration::from_millis(a.op_timeout_ms);
    opts.durable_every_bytes = parse_size(&a.durable_every).map_err(|e| e.to_string())?;
    opts.verify = !a.no_verify;
    opts.keep_cached = a.keep_cached;
    let mut bar = indicatif::ProgressBar::hidden();
    let mut base = 0u64;
    let quiet = a.quiet;
    let report = copy(&opts, &mut |e| match e {
        Event::Started {
            ranges,
            ranges_done,
            bytes_estimate,
            bytes_before,
        } => {
            eprintln!(
                "copy: {} from {} into {}: {ranges} ranges ({ranges_done} done before), about {:.1} MB",
                a.shard,
                a.from,
                a.to.display(),
                bytes_estimate as f64 / 1e6
            );
            base = bytes_before;
            bar = crate::progress_bar(
                bytes_estimate.max(bytes_before),
                "copy",
                quiet,
                "{bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            );
            bar.set_position(bytes_before);
        }
        Event::Progress { bytes, .. } => bar.set_position(base + bytes),
        Event::Log(line) => {
            if quiet {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
    })
    .map_err(|e| format!("copy failed: {e}"))?;
    bar.finish_and_clear();
    println!(
        "copy: DONE  {} pairs  {} bytes  {:.2} s  {:.1} MB/s  ({} of {} ranges resumed){}",
        report.pairs,
        report.bytes,
        report.copy_secs,
        report.mb_per_s(),
        report.ranges_resumed,
        report.ranges,
        if report.verified {
            format!(
                "  verified in {:.2} s, digest {}",
                report.verify_secs,
                report.digest.hex()
            )
        } else {
            String::new()
        }
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "copy",
                "state": "DONE",
                "pairs": report.pairs,
                "bytes": report.bytes,
                "bytes_this_run": report.bytes_this_run,
                "copy_secs": report.copy_secs,
                "mb_per_s": report.mb_per_s(),
                "verify_secs": report.verify_secs,
                "verified": report.verified,
                "digest": report.digest.hex(),
                "ranges": report.ranges,
                "ranges_resumed": report.ranges_resumed,
            })
        );
    }
    if let Some(path) = &a.plot {
        let title = format!(
            "fabrickv copy of {} ({:.1} GB): {:.1} MB/s",
            a.shard,
            report.bytes as f64 / 1e9,
            report.mb_per_s()
        );
        write_plot(path, &title, &report.samples)
            .map_err(|e| format!("the copy is DONE, but its plot is not: {e}"))?;
        eprintln!("copy: rate plot written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// What `copy --plot` says in a binary built without the `bench` feature
/// (the plotting lives in `fabrickv-bench`, which such a build leaves out).
pub const PLOT_WITHOUT_BENCH: &str =
    "--plot needs the benchmarks, and this fabrickv was built without them (cargo feature `bench`)";

#[cfg(feature = "bench")]
fn write_plot(path: &std::path::Path, title: &str, samples: &[(f64, f64)]) -> Result<(), String> {
    fabrickv_bench::plot::write_rate_png(path, title, samples)
}

#[cfg(not(feature = "bench"))]
fn write_plot(_: &std::path::Path, _: &str, _: &[(f64, f64)]) -> Result<(), String> {
    Err(PLOT_WITHOUT_BENCH.into())
}
