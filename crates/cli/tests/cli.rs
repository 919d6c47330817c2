//! End to end: the `fabrickv` binary as a user runs it. A real server
//! process on a free loopback port, the client commands against it, their
//! output and exit codes, and a clean stop on SIGTERM. (The CLI talks to
//! other processes, so it runs over tcp; inproc is in-process only.)

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{serve_with, Served, BIN};

/// A server for the client commands: tcp on loopback, two workers.
fn serve(extra: &[&str]) -> Served {
    serve_with("127.0.0.1:0", 2, extra)
}

fn cli(s: &Served, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .args(["--server", &s.addr])
        .output()
        .expect("run cli")
}

#[test]
fn client_commands_print_values_and_exit_codes() {
    let s = serve(&[]);
    let out = cli(&s, &["put", "greeting", "hello world"]);
    assert!(
        out.status.success(),
        "put failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = cli(&s, &["get", "greeting"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"hello world", "get prints the raw value only");

    let out = cli(&s, &["get", "absent"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));

    cli(&s, &["put", "second", "2"]);
    let out = cli(&s, &["mget", "greeting", "absent", "second"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a missing key makes mget exit 1"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello world\n(nil)\n2\n"
    );

    let out = cli(&s, &["del", "greeting"]);
    assert_eq!(out.status.code(), Some(0));
    let out = cli(&s, &["del", "greeting"]);
    assert_eq!(out.status.code(), Some(1));

    let out = cli(&s, &["stats"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("workers: 2"), "{text}");
    assert!(text.contains("items: 1"), "{text}");
}

#[test]
fn partitions_show_and_move_while_serving() {
    let s = serve(&["--partitions", "8"]);
    assert!(cli(&s, &["put", "k", "v"]).status.success());
    let out = cli(&s, &["partitions", "show"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("epoch 0  workers 2  partitions 8\n"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 10, "{text}");

    let out = cli(
        &s,
        &["partitions", "move", "--partition", "3", "--worker", "0"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("epoch 1 "), "{text}");
    let row: Vec<&str> = text
        .lines()
        .nth(5)
        .expect("partition 3")
        .split_whitespace()
        .collect();
    assert_eq!(&row[..2], ["3", "0"], "partition 3 is worker 0's: {text}");

    let out = cli(
        &s,
        &["partitions", "move", "--partition", "3", "--worker", "2"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NO_SUCH_WORKER"));
    assert_eq!(cli(&s, &["get", "k"]).stdout, b"v", "data stays put");
    let stats = String::from_utf8_lossy(&cli(&s, &["stats"]).stdout).to_string();
    assert!(stats.contains("partitions_owned: 8"), "{stats}");
}

#[test]
fn checkpoint_save_writes_under_the_server_dir_and_a_restart_restores_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_str().expect("utf-8 path");
    let s = serve(&["--checkpoint-dir", root]);
    assert!(cli(&s, &["put", "kept", "across"]).status.success());
    let out = cli(&s, &["checkpoint", "save", "--to", "manual"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!("saved {root}/manual/ckpt-")),
        "{text}"
    );
    let status = String::from_utf8_lossy(&cli(&s, &["checkpoint", "status"]).stdout).to_string();
    assert!(
        status.contains("saving: no\nsaves finished: 1\n"),
        "{status}"
    );
    // A directory outside the server's own is refused, by code.
    let out = cli(&s, &["checkpoint", "save", "--to", "/etc"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CHECKPOINT_REFUSED"));
    drop(s);
    // A new server restored from the directory the save printed.
    let ckpt = text.split_whitespace().nth(1).expect("the directory saved");
    let r = serve(&["--restore", ckpt]);
    assert_eq!(cli(&r, &["get", "kept"]).stdout, b"across");
}

#[test]
fn ttl_expires_keys() {
    let s = serve(&[]);
    assert!(cli(&s, &["put", "short", "v", "--ttl", "0.2"])
        .status
        .success());
    assert!(cli(&s, &["put", "long", "v", "--ttl", "600"])
        .status
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli(&s, &["get", "short"]).status.code() == Some(0) {
        assert!(
            Instant::now() < deadline,
            "key with a 0.2 s TTL never expired"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(cli(&s, &["get", "long"]).stdout, b"v");
}

#[test]
fn failures_exit_2_with_a_message() {
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let out = Command::new(BIN)
        .args([
            "get",
            "k",
            "--server",
            &format!("127.0.0.1:{port}"),
            "--timeout",
            "1",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));

    let s = serve(&[]);
    let long_key = "k".repeat(251);
    let out = cli(&s, &["put", &long_key, "v"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEY_TOO_LONG"));

    let out = Command::new(BIN)
        .args(["serve", "--memory", "lots"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid size"));
}

/// `fabrickv stats | head -1` once panicked with "failed printing to
/// stdout: Broken pipe" (exit 101) when `head` closed first. Here the
/// read end of the pipe is closed before the command starts, so that
/// every write it makes meets a closed pipe, deterministically.
#[test]
fn a_closed_output_pipe_ends_every_command_quietly() {
    let s = serve(&[]);
    assert!(cli(&s, &["put", "k", "v"]).status.success());
    for args in [
        &["stats"][..],
        &["get", "k"],
        &["mget", "k", "k"],
        &["partitions", "show"],
        &["ps", "list"],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(BIN)
            .args(args)
            .args(["--server", &s.addr])
            .env("RUST_BACKTRACE", "1")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run cli");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?} wrote to stderr: {stderr}"
        );
    }
}

/// `get` ends the value with a line end on a terminal (as `redis-cli`
/// does, so the prompt starts on its own line) and prints the raw bytes
/// to a pipe. The terminal is a pty from util-linux's `script`; without
/// `script` on the host the pty half is skipped, saying so.
#[test]
fn get_ends_with_a_line_on_a_terminal_and_is_raw_in_a_pipe() {
    let s = serve(&[]);
    assert!(cli(&s, &["put", "greeting", "hello world"])
        .status
        .success());
    assert_eq!(cli(&s, &["get", "greeting"]).stdout, b"hello world");
    let line = format!("{BIN} get greeting --server {}", s.addr);
    let Ok(out) = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
    else {
        eprintln!("no `script` on this host: the terminal case is not run");
        return;
    };
    assert!(out.status.success(), "{out:?}");
    // The pty turns the line end into CR LF.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello world\r\n");
}

/// `ps create` timed out after the per-call timeout while the server was
/// still building the embedding pool (the table was created anyway). The
/// first create here builds a 1 GiB pool, zeroed and faulted in, which
/// takes far longer than the 0.3 s timeout given: the command must wait
/// for the answer and print the table.
#[test]
fn ps_create_waits_for_the_pool_however_long_the_timeout() {
    let s = serve(&["--dram-pool-gb", "1", "--dram-skip-mlock"]);
    let started = Instant::now();
    let out = cli(&s, &["ps", "create", "emb:8", "--timeout", "0.3"]);
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "after {took:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("table emb id 1 dim 8"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A connect or a later call still has the short timeout.
    let out = cli(&s, &["ps", "tables", "--timeout", "0.3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Under the same columns `ps create` labels.
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(
            "| name | id | dim | optimizer | lr | missing | seed | items |\n\
             |---|---|---|---|---|---|---|---|\n\
             | emb | 1 | 8 | "
        ),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut s = serve(&[]);
    assert!(cli(&s, &["put", "k", "v"]).status.success());
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = s.child.try_wait().expect("wait") {
            break st;
        }
        assert!(Instant::now() < deadline, "server ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "server exited with {status} on SIGTERM");
}

#[test]
fn config_file_is_read_and_flags_override_it() {
    let dir = std::env::temp_dir().join(format!("fabrickv-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("server.toml");
    std::fs::write(&path, "workers = 3\nmode = \"cache\"\nmemory = \"32MB\"\n")
        .expect("write config");
    let s = serve(&["--config", path.to_str().expect("utf-8 path")]);
    let out = cli(&s, &["stats"]);
    assert!(
        out.status.success(),
        "stats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // --workers 2 on the command line beats workers = 3 in the file.
    assert!(text.contains("workers: 2"), "{text}");
    assert!(
        text.contains("pool_bytes: 67108864"),
        "--memory 64MB beats 32MB: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CPUs a thread may run on (`Cpus_allowed_list` of its status).
fn allowed_cpus(path: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(path).unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_else(|| panic!("no Cpus_allowed_list in {path}"));
    fabrickv_types::cpus::parse_cpu_list(list.trim()).expect("kernel CPU list")
}

/// Thread name -> allowed CPUs, for every thread of `pid`.
fn thread_cpus(pid: &str) -> Vec<(String, Vec<usize>)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .filter_map(|t| {
            let tid = t.ok()?.file_name().into_string().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            let cpus = allowed_cpus(&format!("/proc/{pid}/task/{tid}/status"));
            Some((comm.trim().to_string(), cpus))
        })
        .collect()
}

#[test]
fn worker_cpus_pin_each_worker_in_list_order() {
    let ours = allowed_cpus("/proc/thread-self/status");
    // Reversed, so the order of the list (not the CPUs' order) is seen.
    let list: Vec<usize> = ours.iter().rev().take(2).copied().collect();
    let arg = list.iter().map(ToString::to_string).collect::<Vec<_>>();
    let s = serve(&["--worker-cpus", &arg.join(",")]);
    let pid = s.child.id().to_string();
    let want = |w: usize| vec![list[w % list.len()]];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let threads = thread_cpus(&pid);
        let pinned = (0..2).all(|w| {
            threads
                .iter()
                .any(|(name, cpus)| *name == format!("fkv-worker-{w}") && *cpus == want(w))
        });
        // The acceptor starts after the workers: a busy machine can show
        // them pinned before it exists.
        let acceptor = threads.iter().find(|(name, _)| name == "fkv-acceptor");
        if let (true, Some((_, cpus))) = (pinned, acceptor) {
            // Only the workers: the acceptor keeps the process's CPUs.
            assert_eq!(*cpus, ours, "{threads:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "workers not pinned to {list:?}: {threads:?}"
        );
        std::thread::yield_now();
    }
    // A CPU the process may not use is refused before anything starts.
    let out = run(&["serve", "--listen", "127.0.0.1:0", "--worker-cpus", "8191"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("worker_cpus names CPU 8191"), "{err}");
}

/// Runs the binary with `args`, outside any server.
fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run fabrickv")
}

/// The digest, pair count and byte count `shard checksum` prints.
fn checksum(path: &std::path::Path) -> (String, u64, u64) {
    let out = run(&["shard", "checksum", "--path", path.to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!((f.len(), f[2], f[4]), (5, "pairs", "bytes"), "{text}");
    (
        f[0].to_string(),
        f[1].parse().expect("pairs"),
        f[3].parse().expect("bytes"),
    )
}

#[test]
fn shard_gen_is_deterministic_and_checksum_tells_shards_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gen = |name: &str, seed: &str| {
        let p = dir.path().join(name);
        let out = run(&[
            "shard",
            "gen",
            "--path",
            p.to_str().expect("utf-8"),
            "--size",
            "1MB",
            "--key-size",
            "16",
            "--value-size",
            "128",
            "--seed",
            seed,
            "--quiet",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        p
    };
    let (a, b, c) = (gen("a", "5"), gen("b", "5"), gen("c", "6"));
    let da = checksum(&a);
    // 1 MiB of 144-byte pairs.
    assert_eq!((da.1, da.2), ((1 << 20) / 144, (1 << 20) / 144 * 144));
    assert_eq!(checksum(&b), da, "the same seed makes the same shard");
    let dc = checksum(&c);
    assert_eq!((dc.1, dc.2), (da.1, da.2));
    assert_ne!(dc.0, da.0, "another seed, another digest");
    // A shard is never generated over another.
    let again = run(&[
        "shard",
        "gen",
        "--path",
        a.to_str().expect("utf-8"),
        "--size",
        "1MB",
    ]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not empty"));
    assert_eq!(checksum(&a), da);
    // No shard there: an error, and nothing created.
    let none = dir.path().join("none");
    let out = run(&["shard", "checksum", "--path", none.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!none.exists());
}

/// The RESP password never comes from the command line (every user of
/// the host can read a process's arguments): the old flag is gone, and
/// the file flag reports a file it cannot read.
#[test]
fn the_resp_password_comes_from_a_file_or_the_environment_only() {
    let out = run(&["serve", "--grpc", "off", "--resp-password", "hunter2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--resp-password"), "{err}");
    let out = run(&[
        "serve",
        "--grpc",
        "off",
        "--resp-password-file",
        "/nonexistent/fabrickv-resp-password",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read the RESP password file /nonexistent/fabrickv-resp-password"),
        "{err}"
    );
}
