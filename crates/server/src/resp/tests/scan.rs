//! SCAN's cost: how many calls a full iteration takes and how much one
//! call examines (before the occupancy summary, three keys took 5,243 calls, 100 keys at
//! COUNT 10 took 41,944; Redis needs 1 and 10).

use super::*;

/// One SCAN call's reply: the next cursor and the keys.
fn scan_once(c: &mut Conn, cursor: &str, extra: &[&str]) -> (String, Vec<String>) {
    let mut args = vec!["SCAN", cursor];
    args.extend_from_slice(extra);
    let r = c.run(&args);
    let lines: Vec<&str> = r.split("\r\n").collect();
    assert_eq!(lines[0], "*2", "{r}");
    let n: usize = lines[3][1..].parse().expect("count");
    let keys = (0..n).map(|i| lines[5 + 2 * i].to_string()).collect();
    (lines[2].to_string(), keys)
}

/// A full SCAN iteration: the keys of each call, in order.
fn scan_calls(c: &mut Conn, extra: &[&str]) -> Vec<Vec<String>> {
    let mut cursor = "0".to_string();
    let mut calls = Vec::new();
    loop {
        let (next, keys) = scan_once(c, &cursor, extra);
        calls.push(keys);
        assert!(calls.len() <= 100_000, "the iteration ends");
        if next == "0" {
            return calls;
        }
        cursor = next;
    }
}

/// Every distinct key of an iteration.
fn distinct(calls: &[Vec<String>]) -> Vec<String> {
    let mut all: Vec<String> = calls.iter().flatten().cloned().collect();
    all.sort();
    all.dedup();
    all
}

const PARTITIONS: usize = 4;

#[test]
fn scan_returns_a_small_keyspace_in_one_call() {
    let mut c = Conn::new(PARTITIONS);
    assert_eq!(c.run(&["FLUSHDB"]), "+OK\r\n");
    for k in ["a", "b", "c"] {
        assert_eq!(c.run(&["SET", k, "v"]), "+OK\r\n");
    }
    let (next, mut keys) = scan_once(&mut c, "0", &[]);
    keys.sort();
    assert_eq!(
        (next.as_str(), keys),
        ("0", vec!["a".into(), "b".into(), "c".into()])
    );
    let (next, keys) = scan_once(&mut c, "0", &["COUNT", "1000"]);
    assert_eq!((next.as_str(), keys.len()), ("0", 3));
    // An empty keyspace too.
    assert_eq!(c.run(&["FLUSHDB"]), "+OK\r\n");
    assert_eq!(c.run(&["SCAN", "0"]), "*2\r\n$1\r\n0\r\n*0\r\n");
}

#[test]
fn scan_of_100_keys_at_count_10_takes_about_10_calls() {
    let mut c = Conn::new(PARTITIONS);
    for i in 0..100 {
        c.run(&["SET", &format!("key:{i}"), "v"]);
    }
    let calls = scan_calls(&mut c, &["COUNT", "10"]);
    assert_eq!(distinct(&calls).len(), 100);
    assert!(
        calls.len() <= 10 + PARTITIONS,
        "{} calls for 100 keys at COUNT 10",
        calls.len()
    );
}

#[test]
fn scan_count_bounds_the_entries_one_call_examines() {
    let mut c = Conn::new(PARTITIONS);
    for i in 0..2000 {
        c.run(&["SET", &format!("key:{i}"), "v"]);
    }
    // Every call but the last examines at least COUNT entries, and stops
    // at the end of the chain where it reached COUNT: at most a few more.
    let calls = scan_calls(&mut c, &["COUNT", "20"]);
    assert_eq!(distinct(&calls).len(), 2000);
    let (last, full) = calls.split_last().expect("a call");
    for keys in full {
        assert!((20..=40).contains(&keys.len()), "{} keys", keys.len());
    }
    assert!(last.len() <= 40);
    assert!(calls.len() <= 2000 / 20 + 1, "{} calls", calls.len());
    // COUNT bounds work, not the reply: a MATCH that matches nothing still
    // takes about N/COUNT calls, each returning nothing.
    let none = scan_calls(&mut c, &["MATCH", "nothing:*", "COUNT", "20"]);
    assert!(none.iter().all(Vec::is_empty));
    assert!(
        (2000 / 40..=2000 / 20 + 1).contains(&none.len()),
        "{} calls",
        none.len()
    );
    // A large COUNT takes everything in one call.
    let one = scan_calls(&mut c, &["COUNT", "100000"]);
    assert_eq!((one.len(), one[0].len()), (1, 2000));
}
