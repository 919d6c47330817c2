//! `fabrickv checkpoint save|status`: has a running server save its
//! memory (keys, embedding tables, optionally its KV cache) while it
//! serves, and tells how its saves went. The server writes only under
//! its own `--checkpoint-dir`; `--to` names a directory inside it.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use fabrickv_client::CheckpointStatus;

use crate::{connect, ServerArg};

#[derive(Subcommand)]
pub enum CheckpointCommand {
    /// Saves a checkpoint and waits for it; prints the directory written.
    Save {
        #[command(flatten)]
        server: ServerArg,
        /// Where under the server's --checkpoint-dir (a relative path, or
        /// an absolute one inside it); default: the directory itself.
        #[arg(long, value_name = "DIR")]
        to: Option<String>,
        /// Longest wait for the save to finish, in seconds (the save
        /// goes on at the server after the wait ends).
        #[arg(long, value_name = "SECS", default_value_t = 3600.0)]
        wait: f64,
    },
    /// Prints the server's checkpoint status: the last good save, whether
    /// one runs, the last failure.
    Status {
        #[command(flatten)]
        server: ServerArg,
    },
}

/// Runs one `checkpoint` subcommand.
pub fn run(cmd: CheckpointCommand) -> Result<ExitCode, String> {
    match cmd {
        CheckpointCommand::Save { server, to, wait } => {
            let wait = Duration::try_from_secs_f64(wait)
                .map_err(|_| format!("--wait {wait}: not a number of seconds"))?;
            let started = std::time::Instant::now();
            let st = connect(&server)?
                .checkpoint_save(to.as_deref(), wait)
                .map_err(|e| format!("checkpoint save: {e}"))?;
            println!(
                "saved {} (generation {}) in {:.2} s",
                st.dir,
                st.generation,
                started.elapsed().as_secs_f64()
            );
        }
        CheckpointCommand::Status { server } => {
            let st = connect(&server)?
                .checkpoint_status()
                .map_err(|e| format!("checkpoint status: {e}"))?;
            print!("{}", render(&st));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The status as `name: value` lines.
fn render(st: &CheckpointStatus) -> String {
    let last = if st.last_ok_unix_s == 0 {
        "none".to_string()
    } else {
        format!("{} (unix {})", st.dir, st.last_ok_unix_s)
    };
    format!(
        "saving: {}\nsaves finished: {}\nlast good save: {last}\nlast error: {}\n",
        if st.saving { "yes" } else { "no" },
        st.finished,
        st.error.as_deref().unwrap_or("none"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_the_last_save_or_none() {
        let never = render(&CheckpointStatus::default());
        assert!(never.contains("last good save: none\n"), "{never}");
        let st = CheckpointStatus {
            finished: 2,
            last_ok_unix_s: 1_800_000_000,
            generation: 7,
            saving: true,
            dir: "/srv/ckpt/ckpt-7".into(),
            error: Some("disk full".into()),
        };
        let text = render(&st);
        assert!(text.contains("saving: yes\n"));
        assert!(text.contains("last good save: /srv/ckpt/ckpt-7 (unix 1800000000)\n"));
        assert!(text.contains("last error: disk full\n"));
    }
}
