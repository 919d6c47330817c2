//! A memcached or etcd process on loopback, for benchmarks that
//! synchronise their client processes and for tests of the registries.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
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
        let port = free_port()?;
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

/// How long etcd may take to report itself healthy after it starts (it
/// elects itself leader of a one-member cluster first).
pub const ETCD_START_TIMEOUT_MS: u64 = 30_000;

/// Tries to start etcd, each on a fresh pair of ports.
pub const ETCD_START_TRIES: usize = 3;

/// A free loopback port, as the kernel hands one out.
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// A one-member etcd on loopback with a data directory of its own; killed,
/// and the directory removed, when dropped.
pub struct LocalEtcd {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl LocalEtcd {
    /// Starts `etcd` (from PATH) on free loopback ports with a fresh data
    /// directory, and waits until its `/health` says so.
    pub fn start() -> Result<LocalEtcd, String> {
        // Another process may take a port between our choosing it and
        // etcd binding it: etcd then exits at once, and a fresh pair of
        // ports is tried.
        let mut last = String::new();
        for _ in 0..ETCD_START_TRIES {
            match LocalEtcd::start_once() {
                Ok(e) => return Ok(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once() -> Result<LocalEtcd, String> {
        // Both ports held at once, so that they differ.
        let (port, peer) = {
            let a = TcpListener::bind((Ipv4Addr::LOCALHOST, 0));
            let b = TcpListener::bind((Ipv4Addr::LOCALHOST, 0));
            match (
                a.and_then(|l| l.local_addr()),
                b.and_then(|l| l.local_addr()),
            ) {
                (Ok(a), Ok(b)) => (a.port(), b.port()),
                (Err(e), _) | (_, Err(e)) => return Err(format!("cannot find a free port: {e}")),
            }
        };
        let dir = std::env::temp_dir().join(format!("fabrickv-etcd-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .arg("--name=fkv")
            .arg(format!("--data-dir={}", dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=fkv={peer_url}"))
            .arg("--log-level=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!("cannot start etcd ({e}); install it with `make deps` (Debian package etcd-server)")
            })?;
        let mut e = LocalEtcd { child, port, dir };
        let deadline = Instant::now() + Duration::from_millis(ETCD_START_TIMEOUT_MS);
        loop {
            if e.healthy() {
                return Ok(e);
            }
            if let Ok(Some(status)) = e.child.try_wait() {
                let mut why = String::new();
                if let Some(mut err) = e.child.stderr.take() {
                    let _ = err.read_to_string(&mut why);
                }
                let why = why.lines().last().unwrap_or("").to_string();
                return Err(format!("etcd exited at start: {status}: {why}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "etcd on port {port} was not healthy within {ETCD_START_TIMEOUT_MS} ms"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether etcd's `/health` endpoint answers that it is.
    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        let mut body = String::new();
        s.write_all(req.as_bytes()).is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("\"health\":\"true\"")
    }

    /// Its address as a registry URL, `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    /// Its process id, for tests that stop it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
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
