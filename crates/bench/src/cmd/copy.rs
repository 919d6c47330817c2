//! `fabrickv bench copy`: the RocksDB shard replicator's benchmark. A shard of
//! `--size` bytes (16-byte keys, uncompressible values) is generated
//! (`fabrickv_storage::gen`, as `fabrickv shard gen` makes it) and copied
//! from a server in this process to a directory beside it, and the rate
//! is put next to the RocksDB shard replicator's (110 MB/s at 256-byte values,
//! 80 MB/s at 128) and next to the raw pipe: the same bytes through a
//! plain TCP socket into a file on the same disk, measured in the same
//! run.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use fabrickv_copy::{copy, CopyOptions, Event, COPY_PARALLELISM_DEFAULT, COPY_RANGES_DEFAULT};
use fabrickv_server::shard::ShardSpec;
use fabrickv_server::{Server, ServerConfig};
use fabrickv_storage::gen::{generate, GenSpec};
use fabrickv_types::size::parse_size;

use crate::pipe::raw_pipe;
use crate::plot::write_rate_png;

/// The RocksDB shard replicator's copy rate at 256-byte values, in MB/s (the
/// "replicator" columns of the output: the system this one replaces).
pub const REPLICATOR_MB_PER_S_256: f64 = 110.0;

/// The RocksDB shard replicator's copy rate at 128-byte values, in MB/s.
pub const REPLICATOR_MB_PER_S_128: f64 = 80.0;

/// The flags of `fabrickv bench copy`.
#[derive(Args)]
pub struct CopyBenchArgs {
    /// Bytes of keys and values in the shard, e.g. 10GB.
    #[arg(long, default_value = "10GB")]
    size: String,
    /// Bytes of every value (the RocksDB shard replicator was measured at 128 and 256).
    #[arg(long, default_value_t = 256)]
    value_size: usize,
    /// Bytes of every key.
    #[arg(long, default_value_t = 16)]
    key_size: usize,
    /// Directory for the source shard (kept and reused by later runs of
    /// the same size), the copy and the raw pipe's file.
    #[arg(long, default_value = "/tmp/fabrickv-bench-copy")]
    dir: PathBuf,
    /// Ranges of the copy.
    #[arg(long, default_value_t = COPY_RANGES_DEFAULT)]
    ranges: u32,
    /// Data streams of the copy.
    #[arg(long, default_value_t = COPY_PARALLELISM_DEFAULT)]
    parallelism: u16,
    /// Write the rate-over-time PNG here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Remove the source shard afterwards too.
    #[arg(long)]
    clean: bool,
    /// Keep the copy's pages cached (see `fabrickv copy --keep-cached`).
    #[arg(long)]
    keep_cached: bool,
}

/// Generates (or reuses) the source shard, measures the raw pipe, copies
/// the shard and prints the table row and JSON line.
pub fn run(a: CopyBenchArgs) -> Result<(), String> {
    let size = parse_size(&a.size).map_err(|e| format!("--size: {e}"))?;
    let spec = GenSpec::for_size(size, a.key_size, a.value_size, 1);
    let bytes = spec.pairs * (a.key_size + a.value_size) as u64;
    let src = a
        .dir
        .join(format!("src-{bytes}-{}-{}", a.key_size, a.value_size));
    let dst = a.dir.join("dst");
    std::fs::create_dir_all(&a.dir).map_err(|e| format!("{}: {e}", a.dir.display()))?;
    if !src.join("version").exists() {
        let _ = std::fs::remove_dir_all(&src);
        let made = generate(&src, &spec, &mut |_| {}).map_err(|e| e.to_string())?;
        println!("shard gen: {made}");
    } else {
        eprintln!("bench copy: reusing the source shard at {}", src.display());
    }

    // The physical limit first, on its own: the same bytes, TCP into a file.
    let pipe = raw_pipe(bytes, &a.dir).map_err(|e| format!("raw pipe: {e}"))?;
    eprintln!(
        "bench copy: raw pipe (TCP socket into a file, synced): {:.1} MB in {:.2} s, {:.1} MB/s",
        bytes as f64 / 1e6,
        pipe.secs,
        pipe.mb_per_s()
    );

    let server = Server::start(&ServerConfig {
        listen: "127.0.0.1:0".into(),
        workers: Some(1),
        memory_bytes: 16 << 20,
        log_level: "warn".into(),
        shards: vec![ShardSpec {
            name: "bench".into(),
            path: src.clone(),
        }],
        ..ServerConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dst);
    let mut opts = CopyOptions::new(server.addr(), "bench", &dst);
    opts.ranges = a.ranges;
    opts.parallelism = a.parallelism;
    opts.op_timeout = Duration::from_secs(60);
    opts.keep_cached = a.keep_cached;
    let report = copy(&opts, &mut |e| {
        if let Event::Log(line) = e {
            eprintln!("{line}");
        }
    })
    .map_err(|e| format!("copy failed: {e}"))?;
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dst);
    if a.clean {
        let _ = std::fs::remove_dir_all(&src);
    }
    if let Some(path) = &a.plot {
        let title = format!(
            "fabrickv copy, {:.1} GB, {} B values: {:.1} MB/s",
            bytes as f64 / 1e9,
            a.value_size,
            report.mb_per_s()
        );
        write_rate_png(path, &title, &report.samples)?;
        eprintln!("bench copy: plot written to {}", path.display());
    }

    // The RocksDB shard replicator's rate at this value size, where measured.
    let replicator = match a.value_size {
        128 => Some(REPLICATOR_MB_PER_S_128),
        256 => Some(REPLICATOR_MB_PER_S_256),
        _ => None,
    };
    let rate = report.mb_per_s();
    println!(
        "{:>6} | {:>9} | {:>11} | {:>8} | {:>9} | {:>8} | {:>13} | {:>11} | {:>15} | {:>12}",
        "value",
        "shard",
        "pairs",
        "copy s",
        "copy MB/s",
        "verify s",
        "raw pipe MB/s",
        "of raw pipe",
        "replicator MB/s",
        "x replicator"
    );
    println!(
        "{:>4} B | {:>6.1} GB | {:>11} | {:>8.2} | {:>9.1} | {:>8.2} | {:>13.1} | {:>10.2}x | {:>15} | {:>12}",
        a.value_size,
        report.bytes as f64 / 1e9,
        report.pairs,
        report.copy_secs,
        rate,
        report.verify_secs,
        pipe.mb_per_s(),
        rate / pipe.mb_per_s(),
        replicator.map_or("-".into(), |s| format!("{s:.0}")),
        replicator.map_or("-".into(), |s| format!("{:.2}x", rate / s)),
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "copy",
            "key_size": a.key_size,
            "value_size": a.value_size,
            "pairs": report.pairs,
            "bytes": report.bytes,
            "ranges": report.ranges,
            "parallelism": a.parallelism,
            "copy_secs": report.copy_secs,
            "mb_per_s": rate,
            "verify_secs": report.verify_secs,
            "verified": report.verified,
            "raw_pipe_mb_per_s": pipe.mb_per_s(),
            "of_raw_pipe": rate / pipe.mb_per_s(),
            "replicator_mb_per_s": replicator,
            "x_replicator": replicator.map(|s| rate / s),
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole benchmark at a tiny size, so that it never rots: the
    /// shard is generated, piped, copied and verified, and the copy is
    /// removed afterwards while the source is kept for the next run.
    #[test]
    fn a_tiny_copy_runs_end_to_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = || CopyBenchArgs {
            size: "64KB".into(),
            value_size: 256,
            key_size: 16,
            dir: dir.path().to_path_buf(),
            ranges: 2,
            parallelism: 2,
            plot: None,
            clean: false,
            keep_cached: false,
        };
        run(args()).expect("bench copy");
        assert!(!dir.path().join("dst").exists());
        let kept = std::fs::read_dir(dir.path())
            .expect("read dir")
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("src-"));
        assert!(kept, "the source shard is kept for later runs");
        // A second run reuses the source shard.
        run(args()).expect("bench copy again");
    }
}
