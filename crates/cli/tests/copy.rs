//! `fabrickv copy` end to end: real `fabrickv serve --shard` and `fabrickv
//! copy` processes. A copy is identical to its source (the empty key and
//! blob-file values included) over every transport that reaches another
//! process; a target killed mid-copy resumes from its durable positions
//! with `--resume` and starts over without it; a source killed mid-copy
//! fails the copy with a clear error and `--resume` then finishes it; a
//! resume over pairs that changed at the source since the first run is
//! refused (`SOURCE_CHANGED`); a source that never answers times out and leaves nothing behind; a full
//! disk is a clear error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use fabrickv_client::ShardClient;

mod common;

use common::{serve, Served, BIN};

/// The source shard of the kill tests, in bytes: large enough that a copy
/// is still running when a durable position appears.
const KILL_SHARD_BYTES: &str = "12MB";

/// How long a copy (or a durable position) may take to appear.
const WAIT: Duration = Duration::from_secs(120);

static NAMES: AtomicU32 = AtomicU32::new(0);

fn tcp() -> String {
    "127.0.0.1:0".to_string()
}

fn shm() -> String {
    fabrickv_transport_shm::install();
    format!(
        "shm://copy-test-{}-{}",
        std::process::id(),
        NAMES.fetch_add(1, Ordering::Relaxed)
    )
}

fn gen(dir: &Path, size: &str, value_size: u32) {
    let out = Command::new(BIN)
        .args(["shard", "gen", "--quiet", "--size", size])
        .args(["--value-size", &value_size.to_string()])
        .arg("--path")
        .arg(dir)
        .output()
        .expect("run shard gen");
    assert!(out.status.success(), "shard gen: {out:?}");
}

/// The digest `shard checksum` prints for the shard in `dir`.
fn checksum(dir: &Path) -> String {
    let out = Command::new(BIN)
        .args(["shard", "checksum", "--path"])
        .arg(dir)
        .output()
        .expect("run shard checksum");
    assert!(out.status.success(), "shard checksum: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn copy_cmd(addr: &str, to: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["copy", "--from", addr, "--shard", "s", "--quiet", "--json"])
        .arg("--to")
        .arg(to)
        .args(extra);
    c
}

/// The JSON line a successful `copy --json` prints.
fn result_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    serde_json::from_str(line).expect("JSON")
}

/// Waits until the copy into `to` has made some range durable (its
/// progress file names a range with pairs), or the copy ended.
fn await_durable_position(to: &Path, copy: &mut Child) {
    let file = to.join("fabrickv-copy.progress");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let ranges = v["ranges"].as_array().cloned().unwrap_or_default();
            if ranges.iter().any(|r| r["pairs"].as_u64() > Some(0)) {
                return;
            }
        }
        assert!(
            copy.try_wait().expect("poll copy").is_none(),
            "the copy ended before any durable position"
        );
        assert!(Instant::now() < deadline, "no durable position in time");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts a copy and kills it (SIGKILL) once a range is durable.
fn kill_mid_copy(addr: &str, to: &Path, args: &[&str]) {
    let mut copy = copy_cmd(addr, to, args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start copy");
    await_durable_position(to, &mut copy);
    copy.kill().expect("kill -9 the target");
    let _ = copy.wait();
}

/// Stops the server (its shard is then free for `shard checksum`).
fn stop(served: Served) {
    drop(served);
}

fn copy_is_identical(listen: fn() -> String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    gen(&src, "3MB", 256);
    let served = serve(&listen(), &src, 1);
    // Written through the server: the empty key, an inline value, and a
    // value far larger than a data frame's target size.
    let mut c = ShardClient::connect_default(&served.addr).expect("connect");
    c.put("s", b"", b"the empty key").expect("put empty key");
    c.put("s", b"\xff\xfflast", b"inline").expect("put");
    c.put("s", b"big", &vec![7u8; 900 << 10]).expect("put big");
    let out = copy_cmd(&served.addr, &dst, &["--ranges", "5", "--parallelism", "2"])
        .output()
        .expect("run copy");
    let r = result_of(&out);
    assert_eq!(r["state"], "DONE");
    assert_eq!(r["verified"], true);
    assert_eq!(r["ranges_resumed"], 0);
    stop(served);
    let (a, b) = (checksum(&src), checksum(&dst));
    assert_eq!(a, b, "source and copy differ");
    assert!(a.starts_with(r["digest"].as_str().expect("digest")));
}

#[test]
fn tcp_copy_is_identical_to_its_source() {
    copy_is_identical(tcp);
}

/// The copy's control connection authenticates like any native client:
/// without the source's secret it is refused before anything is copied.
#[test]
fn a_copy_from_a_server_with_a_secret_needs_the_secret() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    gen(&src, "1MB", 256);
    let token = dir.path().join("token");
    std::fs::write(&token, "the secret of the copy test\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let token = token.to_str().expect("utf-8").to_string();
    let shard = format!("s={}", src.display());
    let served = common::serve_with(
        &tcp(),
        1,
        &[
            "--shard",
            &shard,
            "--auth-token-file",
            &token,
            "--grpc",
            "off",
        ],
    );
    let out = copy_cmd(&served.addr, &dst, &[])
        .env_remove("FABRICKV_AUTH_TOKEN")
        .env_remove("FABRICKV_AUTH_TOKEN_FILE")
        .output()
        .expect("run copy");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("AUTH_REQUIRED"), "{e}");
    let dst2 = dir.path().join("dst2");
    let out = copy_cmd(&served.addr, &dst2, &["--auth-token-file", &token])
        .output()
        .expect("run copy");
    assert_eq!(result_of(&out)["state"], "DONE");
    stop(served);
    assert_eq!(checksum(&src), checksum(&dst2), "source and copy differ");
}

#[test]
fn shm_copy_is_identical_to_its_source() {
    copy_is_identical(shm);
}

/// Arguments of the kill tests' copies: small durable steps, so a range
/// is durable long before the copy ends.
const KILL_ARGS: [&str; 4] = ["--ranges", "4", "--durable-every", "256KB"];

/// A served source shard of `KILL_SHARD_BYTES` and a copy of it killed
/// once a range is durable: the temporary directory, the source's and the
/// copy's paths, and the server.
fn killed_copy() -> (tempfile::TempDir, PathBuf, PathBuf, Served) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    gen(&src, KILL_SHARD_BYTES, 128);
    let served = serve(&tcp(), &src, 1);
    kill_mid_copy(&served.addr, &dst, &KILL_ARGS);
    (dir, src, dst, served)
}

/// `copy_cmd` with `KILL_ARGS` and `--resume`.
fn resume_cmd(addr: &str, to: &Path) -> Command {
    let mut args = KILL_ARGS.to_vec();
    args.push("--resume");
    copy_cmd(addr, to, &args)
}

#[test]
fn a_killed_target_resumes_with_resume_and_starts_over_without() {
    let (_dir, src, dst, served) = killed_copy();
    let args = KILL_ARGS;
    let r = result_of(&resume_cmd(&served.addr, &dst).output().expect("copy"));
    let (all, this_run) = (
        r["bytes"].as_u64().expect("bytes"),
        r["bytes_this_run"].as_u64().expect("bytes this run"),
    );
    assert!(
        this_run < all,
        "--resume copied {this_run} of {all} bytes again: it did not continue"
    );
    let resumed_digest = r["digest"].clone();

    // Killed again, and rerun without --resume: it starts over.
    kill_mid_copy(&served.addr, &dst, &args);
    let r = result_of(&copy_cmd(&served.addr, &dst, &args).output().expect("copy"));
    assert_eq!(
        r["bytes_this_run"], r["bytes"],
        "a copy without --resume starts over"
    );
    assert_eq!(r["digest"], resumed_digest);
    stop(served);
    assert_eq!(checksum(&src), checksum(&dst));
}

#[test]
fn a_killed_source_fails_the_copy_clearly_and_resume_finishes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    gen(&src, KILL_SHARD_BYTES, 256);
    let served = serve(&tcp(), &src, 1);
    let mut copy = copy_cmd(&served.addr, &dst, &KILL_ARGS)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start copy");
    await_durable_position(&dst, &mut copy);
    stop(served); // SIGKILL
    let out = copy.wait_with_output().expect("copy exits");
    assert!(!out.status.success(), "a copy whose source died succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("UNAVAILABLE") || err.contains("TIMEOUT"),
        "unclear error: {err}"
    );

    let served = serve(&tcp(), &src, 1);
    let r = result_of(&resume_cmd(&served.addr, &dst).output().expect("copy"));
    assert!(r["bytes_this_run"].as_u64() < r["bytes"].as_u64());
    stop(served);
    assert_eq!(checksum(&src), checksum(&dst));
}

/// A key the copy into `to` holds durably: the last key of the first
/// range its progress file names with pairs.
fn held_key(to: &Path) -> Vec<u8> {
    let text = std::fs::read_to_string(to.join("fabrickv-copy.progress")).expect("progress file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("progress JSON");
    let ranges = v["ranges"].as_array().expect("ranges");
    let r = ranges
        .iter()
        .find(|r| r["pairs"].as_u64() > Some(0))
        .expect("a range with durable pairs");
    let hex = r["after"].as_str().expect("after");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn a_resume_over_pairs_changed_at_the_source_is_refused() {
    let (_dir, src, dst, served) = killed_copy();

    // Between the runs, a pair the target already holds changes at the
    // source: continuing would leave the old value in the copy.
    let held = held_key(&dst);
    let mut c = ShardClient::connect_default(&served.addr).expect("connect");
    c.put("s", &held, b"written between the two runs")
        .expect("put");
    let out = resume_cmd(&served.addr, &dst).output().expect("copy");
    assert!(
        !out.status.success(),
        "a resume over a changed source succeeded"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SOURCE_CHANGED") && err.contains("without --resume"),
        "unclear error: {err}"
    );

    // Without --resume the copy starts over and equals the source.
    let r = result_of(
        &copy_cmd(&served.addr, &dst, &KILL_ARGS)
            .output()
            .expect("copy"),
    );
    assert_eq!(r["bytes_this_run"], r["bytes"]);
    stop(served);
    assert_eq!(checksum(&src), checksum(&dst));
}

#[test]
fn a_source_that_never_answers_times_out_and_leaves_nothing() {
    // Accepts connections and reads them, never writes a byte.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || std::io::copy(&mut s, &mut std::io::sink()));
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let dst = dir.path().join("dst");
    let t = Instant::now();
    let out = copy_cmd(
        &addr,
        &dst,
        &["--connect-timeout-ms", "300", "--op-timeout-ms", "300"],
    )
    .output()
    .expect("run copy");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TIMEOUT"), "unclear error: {err}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the timeout was not kept"
    );
    assert!(
        !dst.exists(),
        "a copy that never reached its source wrote {dst:?}"
    );
}

#[test]
fn a_full_disk_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, small) = (dir.path().join("src"), dir.path().join("small"));
    std::fs::create_dir(&small).expect("mkdir");
    // A 4 MiB file system for the target; needs root (CI runs as root).
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("a_full_disk_is_a_clear_error: cannot mount a tmpfs here (not root?); not run");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&small);
    gen(&src, KILL_SHARD_BYTES, 256);
    let served = serve(&tcp(), &src, 1);
    let out = copy_cmd(
        &served.addr,
        &small.join("dst"),
        &["--durable-every", "256KB"],
    )
    .output()
    .expect("run copy");
    assert!(
        !out.status.success(),
        "a copy larger than its disk succeeded"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("INSUFFICIENT_SPACE") || err.contains("No space left"),
        "unclear error: {err}"
    );
}
