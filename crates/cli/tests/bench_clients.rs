//! The multi-client sweeps end to end: `bench ps --clients` and `bench
//! herd --clients` start client processes of the binary, release them at
//! a barrier in a memcached they start (memcached must be installed, as
//! for the registry's tests), and sum their checked figures into the
//! tables of PetPS's and HERD's benchmarks; a client that fails fails the run.

use std::process::{Command, Output};

mod common;

use common::BIN;

/// Runs `fabrickv bench ARGS` (ARGS split at spaces), checks that it
/// succeeds or fails as `succeeds` says, and returns its stdout and stderr.
fn bench(args: &str, succeeds: bool) -> (String, String) {
    let o: Output = Command::new(BIN)
        .arg("bench")
        .args(args.split_whitespace())
        .output()
        .expect("run fabrickv bench");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.success(), succeeds, "{args}:\n{out}\n{err}");
    (out, err)
}

/// The JSON lines of a run's standard output.
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn ps_clients_sum_into_petps_table() {
    let (out, err) = bench(
        "ps --clients 1,2 --key-space-m 0.001 --duration 0.2 --json",
        true,
    );
    assert!(
        out.contains("| clients | Mreq/s sum | Mkv/s sum | status |"),
        "{out}"
    );
    assert!(out.contains("| 2 | "), "{out}");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for (r, n) in rows.iter().zip([1, 2]) {
        assert_eq!(r["bench"], "ps.clients");
        assert_eq!(r["clients"], n);
        assert_eq!(r["status"], "PASS", "{r}");
        assert!(r["mkv_s_sum"].as_f64().expect("a rate") > 0.0, "{r}");
        assert!(r["start_skew_ms"].as_f64().is_some(), "{r}");
    }
    assert!(err.contains("measured starts within"), "{err}");
}

#[test]
fn herd_clients_sum_into_herd_table() {
    let (out, _) = bench(
        "herd --clients 2 --keys-per-partition 500 --duration 0.2 --json",
        true,
    );
    assert!(
        out.contains("Cores  Clients  Batched  Non-batched  Status"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("1      2 "))
        .unwrap_or_else(|| panic!("no row for 1 core, 2 clients:\n{out}"));
    assert!(row.ends_with("PASS"), "{row}");
    let results = json_lines(&out);
    assert_eq!(results.len(), 2, "batched and non-batched:\n{out}");
    for r in &results {
        assert_eq!(r["bench"], "herd");
        assert_eq!(r["params"]["clients"], 2, "{r}");
        assert_eq!(r["wrong_values"], 0, "{r}");
        assert!(r["params"]["checked"].as_u64().expect("checked") > 0, "{r}");
        assert!(r["ops"].as_u64().expect("ops") > 0, "{r}");
    }
}

#[test]
fn a_failing_client_fails_the_sweep() {
    // The parent neither loads nor connects (--server, --no-load); its
    // clients cannot connect, exit with an error, and the row fails.
    let (out, err) = bench(
        "ps --clients 2 --server 127.0.0.1:1 --no-load --key-space-m 0.001 --duration 0.1",
        false,
    );
    assert!(
        out.contains("| 2 | 0.0000 | 0.0000 | FAIL (client "),
        "{out}"
    );
    assert!(err.contains("exited with"), "{err}");
}

#[test]
fn an_unreachable_registry_is_an_error() {
    let args = "herd --clients 2 --keys-per-partition 100 --duration 0.1";
    let (_, err) = bench(&format!("{args} --registry memcached://127.0.0.1:1"), false);
    assert!(err.contains("memcached://127.0.0.1:1"), "{err}");
}
