//! `fabrickv ps ...`: embedding tables from the command line (create,
//! list, preload with a progress bar and `--check-after-preload`, pull).

use std::process::ExitCode;
use std::time::Instant;

use clap::Subcommand;
use fabrickv_client::ps::{preload, verify};
use fabrickv_client::{PsClient, TableDesc, TableSpec};

use crate::ServerArg;

#[derive(Subcommand)]
pub enum PsCommand {
    /// Creates a table (or opens it if one with the same shape exists).
    /// The first one builds the server's embedding pool before it answers
    /// (seconds per GiB): this waits for it, with a spinner on a terminal.
    Create {
        /// Table spec: NAME:DIM[:optimizer=sgd|adagrad][:lr=F][:missing=zeros|init][:seed=N].
        spec: String,
        /// Longest to wait for the server's answer, in seconds (--timeout
        /// bounds the connect only).
        #[arg(long, value_name = "SECS", default_value_t = fabrickv_client::ps::PS_CREATE_WAIT_MS as f64 / 1000.0)]
        create_timeout: f64,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Lists the tables with their shapes and item counts.
    Tables {
        #[command(flatten)]
        server: ServerArg,
    },
    /// Stores keys 1..=N with the table's deterministic initializer.
    Preload {
        /// Table name.
        #[arg(long)]
        table: String,
        /// Number of keys (1..=N).
        #[arg(long)]
        keys: u64,
        /// Then pull every key back and check it (exit 1 on any failure).
        #[arg(long)]
        check_after_preload: bool,
        /// No progress bar (for logs).
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Prints the vectors of some keys, one line per key.
    Pull {
        /// Table name.
        #[arg(long)]
        table: String,
        #[arg(required = true)]
        keys: Vec<u64>,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// What `ps create` and `ps tables` print of a table, in this order.
const TABLE_COLUMNS: [&str; 8] = [
    "name",
    "id",
    "dim",
    "optimizer",
    "lr",
    "missing",
    "seed",
    "items",
];

/// A table's values under [`TABLE_COLUMNS`].
fn table_row(d: &TableDesc) -> [String; 8] {
    [
        d.spec.name.clone(),
        d.id.to_string(),
        d.spec.dim.to_string(),
        d.spec.optimizer.name().to_string(),
        d.spec.lr.to_string(),
        d.spec.missing.name().to_string(),
        d.spec.seed.to_string(),
        d.items.to_string(),
    ]
}

fn connect(s: &ServerArg) -> Result<PsClient, String> {
    let timeout = crate::timeout_of(s)?;
    PsClient::connect_with_timeout(&s.server, timeout)
        .map_err(|e| format!("cannot connect to {}: {e}", s.server))
}

/// A progress bar on stderr counting keys (hidden when `quiet`).
fn bar(len: u64, what: &str, quiet: bool) -> indicatif::ProgressBar {
    crate::progress_bar(len, what, quiet, "{pos}/{len} keys ({per_sec}, eta {eta})")
}

pub fn run(cmd: PsCommand) -> Result<ExitCode, String> {
    match cmd {
        PsCommand::Create {
            spec,
            create_timeout,
            server,
        } => {
            let spec = TableSpec::parse(&spec)?;
            if !(create_timeout.is_finite() && create_timeout > 0.0) {
                return Err(format!(
                    "--create-timeout must be a positive number of seconds, not {create_timeout}"
                ));
            }
            let mut client = connect(&server)?;
            // Drawn only on a terminal; the server says nothing until the
            // table (and, the first time, the pool) is made.
            let spinner = indicatif::ProgressBar::new_spinner();
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            {
                spinner.set_style(style);
            }
            spinner.set_message(format!(
                "creating table {} (the first table builds the embedding pool)",
                spec.name
            ));
            spinner.enable_steady_tick(std::time::Duration::from_millis(200));
            let created = client
                .create_table_within(&spec, std::time::Duration::from_secs_f64(create_timeout));
            spinner.finish_and_clear();
            let d = created.map_err(|e| e.to_string())?;
            // `table NAME id ID dim DIM ...`: the name under the word
            // "table", the other columns labelled as `ps tables` heads them.
            let row = table_row(&d);
            let rest: Vec<String> = TABLE_COLUMNS[1..]
                .iter()
                .zip(&row[1..])
                .map(|(c, v)| format!("{c} {v}"))
                .collect();
            println!("table {} {}", row[0], rest.join(" "));
            Ok(ExitCode::SUCCESS)
        }
        PsCommand::Tables { server } => {
            println!("| {} |", TABLE_COLUMNS.join(" | "));
            println!("|{}", "---|".repeat(TABLE_COLUMNS.len()));
            for d in connect(&server)?.tables().map_err(|e| e.to_string())? {
                println!("| {} |", table_row(&d).join(" | "));
            }
            Ok(ExitCode::SUCCESS)
        }
        PsCommand::Preload {
            table,
            keys,
            check_after_preload,
            quiet,
            server,
        } => {
            let mut c = connect(&server)?;
            let t = c.open_table(&table).map_err(|e| e.to_string())?;
            if keys == 0 {
                return Err("--keys must be at least 1".into());
            }
            let start = Instant::now();
            let b = bar(keys, "preload", quiet);
            preload(&mut c, &t, 1..=keys, |done| b.set_position(done))
                .map_err(|e| format!("preload failed: {e}"))?;
            b.finish_and_clear();
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "preloaded {keys} keys of {:?} (dim {}) in {secs:.2} s: {:.3} Mkv/s, {:.1} MB/s",
                t.spec.name,
                t.spec.dim,
                keys as f64 / secs / 1e6,
                keys as f64 * f64::from(t.spec.dim) * 4.0 / secs / 1e6
            );
            if !check_after_preload {
                return Ok(ExitCode::SUCCESS);
            }
            let b = bar(keys, "check", quiet);
            let r = verify(&mut c, &t, 1..=keys, |done| b.set_position(done))
                .map_err(|e| format!("check failed: {e}"))?;
            b.finish_and_clear();
            if r.ok() {
                eprintln!("check after preload: PASS ({} keys verified)", r.checked);
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!(
                    "check after preload: FAIL ({} of {} keys missing, {} wrong; first: {:?})",
                    r.missing, r.checked, r.wrong, r.first_failures
                );
                Ok(ExitCode::from(1))
            }
        }
        PsCommand::Pull {
            table,
            keys,
            server,
        } => {
            let mut c = connect(&server)?;
            let t = c.open_table(&table).map_err(|e| e.to_string())?;
            let p = c.pull(&t, &keys).map_err(|e| e.to_string())?;
            let dim = t.spec.dim as usize;
            let mut missing = 0;
            for (i, k) in keys.iter().enumerate() {
                let row: Vec<String> = p.values[i * dim..(i + 1) * dim]
                    .iter()
                    .map(|x| format!("{x}"))
                    .collect();
                if !p.found[i] {
                    missing += 1;
                }
                let tag = if p.found[i] { "" } else { " (absent)" };
                println!("{k}{tag}: {}", row.join(" "));
            }
            Ok(if missing > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}
