//! The cluster secret as an operator uses it: `serve --auth-token-file`,
//! the client commands with the same flag or `FABRICKV_AUTH_TOKEN`, the
//! refusal to listen beyond loopback without a secret, and the shm
//! transport's check of the peer's user.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::{serve_with, BIN};

const SECRET: &str = "the secret of the cli tests";

fn token(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{text}\n")).expect("write token");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p.display().to_string()
}

/// Runs a client command against `addr`, with no secret in its
/// environment unless `env` gives one.
fn cli(addr: &str, args: &[&str], env: Option<(&str, &str)>) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).args(["--server", addr]);
    c.env_remove("FABRICKV_AUTH_TOKEN")
        .env_remove("FABRICKV_AUTH_TOKEN_FILE");
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    c.output().expect("run cli")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_secret_file_admits_clients_that_hold_it_and_no_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = token(dir.path(), "token", SECRET);
    let wrong = token(dir.path(), "wrong", "not the secret of the cli tests");
    let s = serve_with(
        "127.0.0.1:0",
        1,
        &["--auth-token-file", &good, "--grpc", "off"],
    );
    let out = cli(
        &s.addr,
        &["put", "k", "v", "--auth-token-file", &good],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = cli(
        &s.addr,
        &["get", "k"],
        Some(("FABRICKV_AUTH_TOKEN", SECRET)),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "v",
        "{}",
        stderr(&out)
    );
    let out = cli(
        &s.addr,
        &["get", "k"],
        Some(("FABRICKV_AUTH_TOKEN_FILE", &good)),
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let out = cli(&s.addr, &["get", "k"], None);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains("AUTH_REQUIRED") && e.contains("--auth-token-file"),
        "{e}"
    );
    let out = cli(&s.addr, &["get", "k", "--auth-token-file", &wrong], None);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(e.contains("AUTH_FAILED"), "{e}");
    assert!(!e.contains("not the secret"), "the secret leaked: {e}");
    let out = cli(
        &s.addr,
        &["get", "k", "--auth-token-file", "/nonexistent/token"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("/nonexistent/token"),
        "{}",
        stderr(&out)
    );
}

/// A secret file that group or others may read is refused, as ssh
/// refuses such a key (it was accepted silently), for the cluster secret
/// and the RESP password alike; `--allow-open-secret-file` or its
/// variable lets it be used.
#[test]
fn a_secret_file_open_to_others_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = token(dir.path(), "token", SECRET);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let serve = |flags: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["serve", "--listen", "127.0.0.1:0", "--grpc", "off"])
            .args(flags)
            .env_remove("FABRICKV_AUTH_TOKEN")
            .env_remove("FABRICKV_AUTH_TOKEN_FILE")
            .env_remove("FABRICKV_RESP_PASSWORD")
            .env_remove("FABRICKV_ALLOW_OPEN_SECRET_FILE");
        c.output().expect("run")
    };
    for flag in ["--auth-token-file", "--resp-password-file"] {
        let out = serve(&[flag, &open]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
        let e = stderr(&out);
        assert!(
            e.contains(&open) && e.contains("644") && e.contains("chmod 600"),
            "{flag}: {e}"
        );
    }
    let out = cli(
        "127.0.0.1:1",
        &["get", "k", "--auth-token-file", &open],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));

    // Allowed, the server starts (and serves on until it is killed).
    let s = serve_with(
        "127.0.0.1:0",
        1,
        &["--auth-token-file", &open, "--allow-open-secret-file"],
    );
    let out = cli(
        &s.addr,
        &["put", "k", "v", "--auth-token-file", &open],
        Some(("FABRICKV_ALLOW_OPEN_SECRET_FILE", "1")),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_listener_beyond_loopback_needs_a_secret_or_insecure() {
    // Refused while the configuration is checked, before anything binds.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--grpc", "off"])
        .env_remove("FABRICKV_AUTH_TOKEN")
        .env_remove("FABRICKV_AUTH_TOKEN_FILE")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains("0.0.0.0:0") && e.contains("--auth-token-file") && e.contains("--insecure"),
        "{e}"
    );
}

/// shm admits the server's own user; another only by `--shm-allow-uid`
/// (the kernel says who the peer is). Needs root, to run the client as
/// another user.
#[test]
fn shm_admits_another_user_only_when_allowed() {
    const NOBODY: u32 = 65534;
    if !is_root() {
        eprintln!("skipped: running a client as another user needs root");
        return;
    }
    let run_as_nobody = |addr: &str| {
        Command::new(BIN)
            .args(["put", "k", "v", "--server", addr])
            .env_remove("FABRICKV_AUTH_TOKEN")
            .env_remove("FABRICKV_AUTH_TOKEN_FILE")
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .expect("run as nobody")
    };
    let name = format!("shm://fkv-cli-auth-{}", std::process::id());
    let s = serve_with(&name, 1, &["--grpc", "off"]);
    let out = run_as_nobody(&s.addr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("PEER_NOT_ALLOWED"),
        "{}",
        stderr(&out)
    );
    drop(s);
    let uid = NOBODY.to_string();
    let name = format!("{name}-allowed");
    let s = serve_with(&name, 1, &["--grpc", "off", "--shm-allow-uid", &uid]);
    let out = run_as_nobody(&s.addr);
    assert!(out.status.success(), "{}", stderr(&out));
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
