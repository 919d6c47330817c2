//! A memcached process on loopback, for benchmarks that synchronise their
//! client processes and for tests of the registry.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long memcached may take to accept connections after it starts.
pub const MEMCACHED_START_TIMEOUT_MS: u64 = 10_000;

/// A memcached child process listening on 127.0.0.1; killed when dropped.
pub struct LocalMemcached {
    child: Child,
    port: u16,
}

impl LocalMemcached {
    /// Starts `memcached` (from PATH) on a free loopback port and waits
    /// until it accepts connections.
    pub fn start() -> Result<LocalMemcached, String> {
        // Ask the kernel for a free port; memcached binds it right after.
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
        let mut cmd = Command::new("memcached");
        cmd.args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-m",
            "64",
        ]);
        if effective_uid() == Some(0) {
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                format!("cannot start memcached ({e}); install it with `make deps` (Debian package memcached)")
            })?;
        let mut m = LocalMemcached { child, port };
        let deadline = Instant::now() + Duration::from_millis(MEMCACHED_START_TIMEOUT_MS);
        loop {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(m);
            }
            if let Ok(Some(status)) = m.child.try_wait() {
                return Err(format!("memcached exited at start: {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "memcached did not accept connections on port {port} within {MEMCACHED_START_TIMEOUT_MS} ms"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Its address as a registry URL, `memcached://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("memcached://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalMemcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's effective user id, from the `Uid:` line of
/// `/proc/self/status` (real, effective, saved, filesystem); `None` when
/// it cannot be read. memcached refuses to run as root unless given `-u`.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_effective_uid(&status)
}

/// The effective uid in the text of a `/proc/PID/status` file.
fn parse_effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_uid() {
        let status = "Name:\tx\nUid:\t1000\t0\t1000\t1000\nGid:\t5\t5\t5\t5\n";
        assert_eq!(parse_effective_uid(status), Some(0));
        assert_eq!(parse_effective_uid("Name:\tx\n"), None);
        assert!(
            effective_uid().is_some(),
            "/proc/self/status has a Uid line"
        );
    }
}
