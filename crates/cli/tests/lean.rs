//! The binary with and without its benchmarks (cargo feature `bench`):
//! a build without them serves and answers as ever, has no `bench`
//! subcommand, and refuses `copy --plot` before copying anything.
//! `make build-lean` runs this file on a `--no-default-features` build;
//! `cargo test` runs it on the default one.

use std::process::{Command, Output};

mod common;

use common::{serve_with, BIN};

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run fabrickv")
}

#[test]
fn client_commands_work_with_or_without_benchmarks() {
    let s = serve_with("127.0.0.1:0", 1, &[]);
    let out = run(&["put", "k", "v", "--server", &s.addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["get", "k", "--server", &s.addr]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout, b"v");
}

#[cfg(feature = "bench")]
#[test]
fn bench_subcommand_is_there_with_the_bench_feature() {
    let out = run(&["bench", "--help"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("kv"));
}

#[cfg(not(feature = "bench"))]
#[test]
fn bench_subcommand_is_absent_without_the_bench_feature() {
    let out = run(&["bench", "kv"]);
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unrecognized subcommand 'bench'"), "{err}");
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).into_owned();
    assert!(!help.contains("bench"), "{help}");
}

#[cfg(not(feature = "bench"))]
#[test]
fn copy_plot_is_refused_before_copying_without_the_bench_feature() {
    let dir = tempfile::tempdir().expect("tempdir");
    let to = dir.path().join("copy");
    let plot = dir.path().join("rate.png");
    // Nothing listens on port 1: a copy that started would fail to
    // connect instead, with another message.
    let out = run(&[
        "copy",
        "--from",
        "127.0.0.1:1",
        "--shard",
        "s",
        "--to",
        to.to_str().expect("utf-8 path"),
        "--plot",
        plot.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("built without them"), "{err}");
    assert!(!to.exists() && !plot.exists());
}
