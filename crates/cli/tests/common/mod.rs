//! What the binary's tests share: a `fabrickv serve` child process that
//! is killed (SIGKILL) when dropped.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod netns;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_fabrickv");

/// A running `fabrickv serve`; dropping it is `kill -9`.
pub struct Served {
    pub child: Child,
    /// The resolved native address.
    pub addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `fabrickv serve --shard s=DIR` with `workers` workers on
/// `listen`.
#[allow(dead_code)] // not every test file serves a shard
pub fn serve(listen: &str, dir: &Path, workers: u32) -> Served {
    let shard = format!("s={}", dir.display());
    serve_with(listen, workers, &["--shard", &shard])
}

/// Starts `fabrickv serve` with `workers` workers on `listen` (port 0: the
/// server picks a free one, so no test races another for a port) and
/// `extra` arguments, and learns the resolved address from the line it
/// prints once listening.
pub fn serve_with(listen: &str, workers: u32, extra: &[&str]) -> Served {
    let workers = workers.to_string();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", listen, "--workers", &workers])
        .args(["--memory", "64MB", "--log-level", "warn"])
        // The gRPC default address must bind or the server refuses to
        // start; tests run servers side by side, so theirs is off unless
        // a test names one.
        .args(if extra.contains(&"--grpc") {
            &[][..]
        } else {
            &["--grpc", "off"][..]
        })
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("server exited before listening")
            .expect("read stderr");
        if let Some(rest) = line.split("serving on ").nth(1) {
            let addr = rest.split_whitespace().next().expect("address");
            break addr.trim_end_matches(',').to_string();
        }
    };
    // Keep draining the server's log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Served { child, addr }
}
