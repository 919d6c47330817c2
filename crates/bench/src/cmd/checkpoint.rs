//! `fabrickv bench checkpoint`: flags, the run's directory, and the check
//! of the run.

use std::path::PathBuf;
use std::time::Duration;

use fabrickv_types::limits::{PS_DIM_MAX, VALUE_BYTES_MAX};

use crate::checkpoint::{self, CkptOpts};

/// Flags of `fabrickv bench checkpoint`. The defaults are the issue's data
/// set: 2 GB of embedding rows and 1 GB of kv values.
#[derive(clap::Args)]
pub struct CheckpointBenchArgs {
    /// Embedding rows (keys 1..=N of one table); 0 for none.
    #[arg(long, default_value_t = 8_000_000)]
    embedding_keys: u64,
    /// Floats (f32) per embedding row.
    #[arg(long, default_value_t = 64)]
    dim: u32,
    /// Keys of the kv data set (16-byte keys); at least 1.
    #[arg(long, default_value_t = 1_000_000)]
    kv_keys: u64,
    /// Value length of the kv data set, in bytes.
    #[arg(long, default_value_t = 1024)]
    value_size: usize,
    /// Worker threads of each FabricKV server.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds the writer runs without a save (its rate during a save is
    /// judged against this one).
    #[arg(long, default_value_t = 3.0)]
    load_seconds: f64,
    /// Where the files go (checkpoints, dd's file, the RDB, server logs):
    /// the run makes a fresh directory in it [default: the temp dir].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Leave the run's directory in place at the end.
    #[arg(long)]
    keep: bool,
    /// Also the kv part beside redis-server (BGSAVE, restart from
    /// dump.rdb), and FabricKV holding only the kv part.
    #[arg(long)]
    compare: bool,
    /// Also print one JSON line per result.
    #[arg(long)]
    json: bool,
}

/// The flags as a run's options, `dir` the run's own directory; an error
/// names the flag that is wrong.
fn opts(a: &CheckpointBenchArgs, dir: PathBuf) -> Result<CkptOpts, String> {
    if !(a.load_seconds.is_finite() && a.load_seconds > 0.0) {
        return Err(format!(
            "--load-seconds must be a positive number, not {}",
            a.load_seconds
        ));
    }
    if a.kv_keys == 0 {
        return Err("--kv-keys must be at least 1 (the writer overwrites kv keys)".into());
    }
    if a.value_size == 0 || a.value_size > VALUE_BYTES_MAX {
        return Err(format!(
            "--value-size must be 1 to {VALUE_BYTES_MAX} bytes, not {}",
            a.value_size
        ));
    }
    if a.dim == 0 || a.dim as usize > PS_DIM_MAX {
        return Err(format!("--dim must be 1 to {PS_DIM_MAX}, not {}", a.dim));
    }
    if a.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    let o = CkptOpts {
        embedding_keys: a.embedding_keys,
        dim: a.dim,
        kv_keys: a.kv_keys,
        value_size: a.value_size,
        workers: a.workers,
        dir,
        load_seconds: Duration::from_secs_f64(a.load_seconds),
        compare: a.compare,
    };
    if !o.sizes_fit() {
        return Err("the data set's size overflows; give fewer keys".into());
    }
    Ok(o)
}

/// Runs it in a fresh directory (removed at the end unless `--keep`);
/// fails if a step failed or a value read back was wrong, not for a
/// missed target.
pub fn run(a: &CheckpointBenchArgs) -> Result<(), String> {
    let base = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let base = std::path::absolute(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    let dir = base.join(format!("fabrickv-bench-checkpoint-{}", std::process::id()));
    // Checked before the directory exists, so that a bad flag leaves none.
    let o = opts(a, dir.clone())?;
    std::fs::create_dir_all(&base).map_err(|e| format!("cannot create {}: {e}", base.display()))?;
    // Not create_dir_all: a directory left by an earlier run with this
    // pid would hold checkpoints a server started here would restore.
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let r = checkpoint::run(&o);
    if a.keep {
        eprintln!("bench checkpoint: files kept in {}", dir.display());
    } else if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("bench checkpoint: cannot remove {}: {e}", dir.display());
    }
    let r = r?;
    r.print();
    if a.json {
        for l in r.json_lines() {
            println!("{l}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: CheckpointBenchArgs,
    }

    fn opts_of(args: &[&str]) -> Result<CkptOpts, String> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        opts(&cli.a, PathBuf::from("/nowhere"))
    }

    #[test]
    fn the_defaults_are_the_issues_data_set() {
        let o = opts_of(&[]).expect("defaults parse");
        // 8M rows of 64 floats (2.05 GB) and 1M values of 1 KiB (1.02 GB).
        assert_eq!(o.row_bytes() - o.embedding_keys * 8, 2_048_000_000);
        assert_eq!(o.kv_keys * o.value_size as u64, 1_024_000_000);
        assert_eq!(o.workers, 2);
    }

    #[test]
    fn bad_flags_are_errors_not_panics() {
        for bad in [
            &["--load-seconds", "0"][..],
            &["--load-seconds", "nan"],
            &["--kv-keys", "0"],
            &["--value-size", "0"],
            &["--value-size", "2000000"],
            &["--dim", "0"],
            &["--workers", "0"],
            &["--kv-keys", "18446744073709551615"],
        ] {
            assert!(opts_of(bad).is_err(), "{bad:?} was taken");
        }
    }
}
