//! The string, keyspace and transaction commands, sans-I/O.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// Runs one command on a connection of `shared` (a second client).
fn run_on(s: &mut RespConnState, shared: &RespShared, now_ms: u64, args: &[&str]) -> String {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    let input = cmd(&a);
    let mut out = Vec::new();
    let p = s.process(shared, &input, &mut out, now_ms);
    assert_eq!(p.consumed, input.len());
    String::from_utf8_lossy(&out).into_owned()
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

#[test]
fn setex_psetex_setnx_msetnx() {
    let mut c = Conn::new(4);
    assert_eq!(c.run(&["SETEX", "k", "10", "v"]), "+OK\r\n");
    assert_eq!(c.run(&["TTL", "k"]), ":10\r\n");
    assert_eq!(c.run(&["PSETEX", "p", "1500", "v"]), "+OK\r\n");
    assert_eq!(c.run(&["PTTL", "p"]), ":1500\r\n");
    c.expect_err(
        &["SETEX", "k", "0", "v"],
        "invalid expire time in 'setex' command",
    );
    c.expect_err(
        &["PSETEX", "k", "-5", "v"],
        "invalid expire time in 'psetex' command",
    );
    c.expect_err(
        &["SETEX", "k", "x", "v"],
        "value is not an integer or out of range",
    );
    assert_eq!(c.run(&["SETNX", "n", "1"]), ":1\r\n");
    assert_eq!(c.run(&["SETNX", "n", "2"]), ":0\r\n");
    assert_eq!(c.run(&["GET", "n"]), bulk("1"));
    // MSETNX: all or nothing, across partitions.
    assert_eq!(c.run(&["MSETNX", "a", "1", "b", "2", "c", "3"]), ":1\r\n");
    assert_eq!(c.run(&["MSETNX", "d", "4", "a", "x"]), ":0\r\n");
    assert_eq!(c.run(&["EXISTS", "d"]), ":0\r\n");
    assert_eq!(c.run(&["GET", "a"]), bulk("1"));
    c.expect_err(
        &["MSETNX", "a", "1", "b"],
        "wrong number of arguments for 'msetnx' command",
    );
}

#[test]
fn getex_getdel_getset() {
    let mut c = Conn::new(2);
    assert_eq!(c.run(&["GETEX", "none"]), "$-1\r\n");
    c.run(&["SET", "k", "v"]);
    assert_eq!(c.run(&["GETEX", "k", "EX", "100"]), bulk("v"));
    assert_eq!(c.run(&["TTL", "k"]), ":100\r\n");
    assert_eq!(c.run(&["GETEX", "k", "PX", "5000"]), bulk("v"));
    assert_eq!(c.run(&["PTTL", "k"]), ":5000\r\n");
    let at = (unix_ms() / 1000 + 200).to_string();
    assert_eq!(c.run(&["GETEX", "k", "EXAT", &at]), bulk("v"));
    let ttl: i64 = c.run(&["TTL", "k"])[1..].trim().parse().expect("ttl");
    assert!((198..=201).contains(&ttl), "{ttl}");
    let at = (unix_ms() + 30_000).to_string();
    assert_eq!(c.run(&["GETEX", "k", "PXAT", &at]), bulk("v"));
    assert_eq!(c.run(&["GETEX", "k", "PERSIST"]), bulk("v"));
    assert_eq!(c.run(&["TTL", "k"]), ":-1\r\n");
    c.expect_err(
        &["GETEX", "k", "EX", "0"],
        "invalid expire time in 'getex' command",
    );
    c.expect_err(&["GETEX", "k", "EX"], "syntax error");
    c.expect_err(&["GETEX", "k", "PERSIST", "EX", "1"], "syntax error");
    // A time already past deletes the key once read.
    assert_eq!(c.run(&["GETEX", "k", "PXAT", "1"]), bulk("v"));
    assert_eq!(c.run(&["EXISTS", "k"]), ":0\r\n");
    c.run(&["SET", "k", "v"]);
    assert_eq!(c.run(&["GETDEL", "k"]), bulk("v"));
    assert_eq!(c.run(&["GETDEL", "k"]), "$-1\r\n");
    c.run(&["SETEX", "g", "100", "old"]);
    assert_eq!(c.run(&["GETSET", "g", "new"]), bulk("old"));
    assert_eq!(c.run(&["TTL", "g"]), ":-1\r\n");
    assert_eq!(c.run(&["GETSET", "fresh", "x"]), "$-1\r\n");
    assert_eq!(c.run(&["GET", "fresh"]), bulk("x"));
}

#[test]
fn append_getrange_setrange() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["APPEND", "k", "Hello"]), ":5\r\n");
    c.run(&["EXPIRE", "k", "100"]);
    assert_eq!(c.run(&["APPEND", "k", " World"]), ":11\r\n");
    assert_eq!(c.run(&["TTL", "k"]), ":100\r\n", "APPEND keeps the TTL");
    c.run(&["SET", "s", "This is a string"]);
    assert_eq!(c.run(&["GETRANGE", "s", "0", "3"]), bulk("This"));
    assert_eq!(c.run(&["GETRANGE", "s", "-3", "-1"]), bulk("ing"));
    assert_eq!(
        c.run(&["GETRANGE", "s", "0", "-1"]),
        bulk("This is a string")
    );
    assert_eq!(c.run(&["GETRANGE", "s", "10", "100"]), bulk("string"));
    assert_eq!(c.run(&["GETRANGE", "s", "5", "3"]), bulk(""));
    assert_eq!(c.run(&["GETRANGE", "s", "-1", "-5"]), bulk(""));
    assert_eq!(
        c.run(&["GETRANGE", "s", "-9223372036854775808", "2"]),
        bulk("Thi")
    );
    assert_eq!(c.run(&["SUBSTR", "s", "0", "3"]), bulk("This"));
    assert_eq!(c.run(&["GETRANGE", "none", "0", "3"]), bulk(""));
    c.run(&["SET", "h", "Hello World"]);
    assert_eq!(c.run(&["SETRANGE", "h", "6", "Redis"]), ":11\r\n");
    assert_eq!(c.run(&["GET", "h"]), bulk("Hello Redis"));
    assert_eq!(c.run(&["SETRANGE", "z", "6", "Redis"]), ":11\r\n");
    assert_eq!(c.run(&["GET", "z"]), bulk("\0\0\0\0\0\0Redis"));
    assert_eq!(c.run(&["SETRANGE", "empty", "3", ""]), ":0\r\n");
    assert_eq!(c.run(&["EXISTS", "empty"]), ":0\r\n");
    c.expect_err(&["SETRANGE", "h", "-1", "x"], "offset is out of range");
    c.expect_err(
        &["SETRANGE", "h", "536870912", "x"],
        "string exceeds maximum allowed size (proto-max-bulk-len)",
    );
}

#[test]
fn incrbyfloat_formats_as_redis() {
    let mut c = Conn::new(1);
    c.run(&["SET", "f", "10.50"]);
    assert_eq!(c.run(&["INCRBYFLOAT", "f", "0.1"]), bulk("10.6"));
    assert_eq!(c.run(&["INCRBYFLOAT", "f", "-5"]), bulk("5.6"));
    c.run(&["SET", "f", "5.0e3"]);
    assert_eq!(c.run(&["INCRBYFLOAT", "f", "2.0e2"]), bulk("5200"));
    assert_eq!(c.run(&["INCRBYFLOAT", "new", "3"]), bulk("3"));
    c.expect_err(&["INCRBYFLOAT", "f", "abc"], "value is not a valid float");
    c.run(&["SET", "t", "text"]);
    c.expect_err(&["INCRBYFLOAT", "t", "1"], "value is not a valid float");
    c.run(&["SET", "big", "1e308"]);
    c.expect_err(
        &["INCRBYFLOAT", "big", "1e308"],
        "increment would produce NaN or Infinity",
    );
}

#[test]
fn lcs_as_in_redis_docs() {
    let mut c = Conn::new(4);
    c.run(&["MSET", "key1", "ohmytext", "key2", "mynewtext"]);
    assert_eq!(c.run(&["LCS", "key1", "key2"]), bulk("mytext"));
    assert_eq!(c.run(&["LCS", "key1", "key2", "LEN"]), ":6\r\n");
    assert_eq!(
        c.run(&["LCS", "key1", "key2", "IDX"]),
        "*4\r\n$7\r\nmatches\r\n*2\r\n*2\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n*2\r\n*2\r\n:2\r\n:3\r\n*2\r\n:0\r\n:1\r\n$3\r\nlen\r\n:6\r\n"
    );
    assert_eq!(
        c.run(&["LCS", "key1", "key2", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN"]),
        "*4\r\n$7\r\nmatches\r\n*1\r\n*3\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n:4\r\n$3\r\nlen\r\n:6\r\n"
    );
    c.expect_err(
        &["LCS", "key1", "key2", "LEN", "IDX"],
        "If you want both the length and indexes, please just use IDX.",
    );
    c.expect_err(&["LCS", "key1", "key2", "NOPE"], "syntax error");
    assert_eq!(c.run(&["LCS", "key1", "missing"]), bulk(""));
    let long = "a".repeat(4000);
    c.run(&["MSET", "l1", &long, "l2", &long]);
    let r = c.run(&["LCS", "l1", "l2"]);
    assert!(r.starts_with("-ERR LCS of 4000 and 4000 bytes"), "{r}");
}

#[test]
fn set_exat_pxat() {
    let mut c = Conn::new(1);
    let at = (unix_ms() / 1000 + 100).to_string();
    assert_eq!(c.run(&["SET", "k", "v", "EXAT", &at]), "+OK\r\n");
    let ttl: i64 = c.run(&["TTL", "k"])[1..].trim().parse().expect("ttl");
    assert!((98..=101).contains(&ttl), "{ttl}");
    let at = (unix_ms() + 50_000).to_string();
    assert_eq!(c.run(&["SET", "k", "v", "PXAT", &at, "GET"]), bulk("v"));
    c.expect_err(
        &["SET", "k", "v", "EXAT", "0"],
        "invalid expire time in 'set' command",
    );
    c.expect_err(&["SET", "k", "v", "EXAT", "1", "PX", "1"], "syntax error");
    // A time already past: stored expired, so gone.
    assert_eq!(c.run(&["SET", "k", "v", "PXAT", "5"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$-1\r\n");
}

#[test]
fn expire_flags_and_overflow_as_redis() {
    let mut c = Conn::new(1);
    c.run(&["SET", "k", "v"]);
    // No TTL: GT never applies, LT always does.
    assert_eq!(c.run(&["EXPIRE", "k", "100", "GT", "XX"]), ":0\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "100", "LT", "XX"]), ":0\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "100", "LT"]), ":1\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "200", "GT", "XX"]), ":1\r\n");
    assert_eq!(c.run(&["TTL", "k"]), ":200\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "50", "LT", "XX"]), ":1\r\n");
    assert_eq!(c.run(&["TTL", "k"]), ":50\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "60", "LT", "XX"]), ":0\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "10", "NX"]), ":0\r\n");
    c.expect_err(
        &["EXPIRE", "k", "100", "NX", "XX"],
        "NX and XX, GT or LT options at the same time are not compatible",
    );
    c.expect_err(
        &["EXPIRE", "k", "100", "GT", "LT"],
        "GT and LT options at the same time are not compatible",
    );
    c.expect_err(&["EXPIRE", "k", "100", "SOON"], "Unsupported option SOON");
    // Overflow is refused and the key kept.
    c.expect_err(
        &["EXPIRE", "k", "-9223372036854776"],
        "invalid expire time in 'expire' command",
    );
    assert_eq!(c.run(&["EXISTS", "k"]), ":1\r\n");
    c.expect_err(
        &["PEXPIRE", "k", "9223372036854775807"],
        "invalid expire time in 'pexpire' command",
    );
    c.expect_err(
        &["EXPIREAT", "k", "9223372036854775807"],
        "invalid expire time in 'expireat' command",
    );
    assert_eq!(c.run(&["TTL", "k"]), ":50\r\n");
    // A time in the past deletes it.
    assert_eq!(c.run(&["EXPIRE", "k", "-9223372036854775"]), ":1\r\n");
    assert_eq!(c.run(&["EXISTS", "k"]), ":0\r\n");
}

#[test]
fn expireat_and_expiretime() {
    let mut c = Conn::new(2);
    c.run(&["SET", "k", "v"]);
    assert_eq!(c.run(&["EXPIRETIME", "k"]), ":-1\r\n");
    assert_eq!(c.run(&["PEXPIRETIME", "none"]), ":-2\r\n");
    let at = unix_ms() / 1000 + 1000;
    assert_eq!(c.run(&["EXPIREAT", "k", &at.to_string()]), ":1\r\n");
    let got: i64 = c.run(&["EXPIRETIME", "k"])[1..]
        .trim()
        .parse()
        .expect("int");
    assert!((at - 1..=at + 1).contains(&got), "{got} vs {at}");
    let pat = unix_ms() + 777_000;
    assert_eq!(c.run(&["PEXPIREAT", "k", &pat.to_string()]), ":1\r\n");
    let got: i64 = c.run(&["PEXPIRETIME", "k"])[1..]
        .trim()
        .parse()
        .expect("int");
    assert!((got - pat).abs() <= 5, "{got} vs {pat}");
    assert_eq!(
        c.run(&["PEXPIREAT", "k", &(pat + 1000).to_string(), "LT"]),
        ":0\r\n"
    );
    assert_eq!(c.run(&["EXPIREAT", "k", "1"]), ":1\r\n");
    assert_eq!(c.run(&["EXISTS", "k"]), ":0\r\n");
    assert_eq!(c.run(&["EXPIREAT", "k", "1"]), ":0\r\n");
}

#[test]
fn keyspace_commands() {
    let mut c = Conn::new(4);
    c.run(&["MSET", "a", "1", "b", "2", "c", "3"]);
    assert_eq!(c.run(&["EXISTS", "a", "a", "b", "zz"]), ":3\r\n");
    assert_eq!(c.run(&["TOUCH", "a", "b", "zz"]), ":2\r\n");
    assert_eq!(c.run(&["TYPE", "a"]), "+string\r\n");
    assert_eq!(c.run(&["TYPE", "zz"]), "+none\r\n");
    assert_eq!(c.run(&["UNLINK", "a", "zz"]), ":1\r\n");
    c.run(&["SETEX", "src", "100", "payload"]);
    assert_eq!(c.run(&["RENAME", "src", "dst"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "dst"]), bulk("payload"));
    assert_eq!(c.run(&["TTL", "dst"]), ":100\r\n", "RENAME keeps the TTL");
    assert_eq!(c.run(&["EXISTS", "src"]), ":0\r\n");
    c.expect_err(&["RENAME", "src", "x"], "no such key");
    assert_eq!(c.run(&["RENAME", "dst", "dst"]), "+OK\r\n");
    assert_eq!(c.run(&["RENAMENX", "dst", "b"]), ":0\r\n");
    assert_eq!(c.run(&["RENAMENX", "dst", "e"]), ":1\r\n");
    c.expect_err(&["RENAMENX", "nope", "e"], "no such key");
    assert_eq!(c.run(&["COPY", "e", "f"]), ":1\r\n");
    assert_eq!(c.run(&["COPY", "e", "f"]), ":0\r\n");
    c.run(&["SET", "e", "changed"]);
    assert_eq!(c.run(&["COPY", "e", "f", "REPLACE"]), ":1\r\n");
    assert_eq!(c.run(&["GET", "f"]), bulk("changed"));
    assert_eq!(c.run(&["COPY", "e", "g", "DB", "0"]), ":1\r\n");
    assert!(c
        .run(&["COPY", "e", "g", "DB", "1"])
        .starts_with("-ERR COPY to another database"));
    c.expect_err(
        &["COPY", "e", "e"],
        "source and destination objects are the same",
    );
    assert_eq!(c.run(&["COPY", "nope", "h"]), ":0\r\n");
    c.expect_err(&["COPY", "e", "h", "BOGUS"], "syntax error");
    // KEYS.
    c.run(&["FLUSHDB"]);
    c.run(&[
        "MSET", "user:1", "a", "user:2", "b", "user:10", "c", "other", "d",
    ]);
    let mut keys = c.run(&["KEYS", "user:?"]);
    assert!(keys.starts_with("*2\r\n"), "{keys}");
    assert!(keys.contains("user:1\r\n") && keys.contains("user:2\r\n"));
    keys = c.run(&["KEYS", "*"]);
    assert!(keys.starts_with("*4\r\n"), "{keys}");
    assert_eq!(c.run(&["KEYS", "other"]), "*1\r\n$5\r\nother\r\n");
    assert_eq!(c.run(&["KEYS", "nothing"]), "*0\r\n");
    assert_eq!(c.run(&["KEYS", "user:[^2]*"]).lines().count(), 5);
    // RANDOMKEY.
    let r = c.run(&["RANDOMKEY"]);
    assert!(["user:1", "user:2", "user:10", "other"]
        .iter()
        .any(|k| r == bulk(k)));
    assert_eq!(c.run(&["FLUSHALL", "ASYNC"]), "+OK\r\n");
    assert_eq!(c.run(&["DBSIZE"]), ":0\r\n");
    assert_eq!(c.run(&["RANDOMKEY"]), "$-1\r\n");
    c.expect_err(&["FLUSHDB", "SOON"], "syntax error");
    assert_eq!(c.run(&["FLUSHDB", "SYNC"]), "+OK\r\n");
}

/// Runs a full SCAN iteration; returns every key returned (with repeats).
fn scan_all(s: &mut RespConnState, shared: &RespShared, extra: &[&str]) -> Vec<String> {
    let mut cursor = "0".to_string();
    let mut keys = Vec::new();
    loop {
        let mut args = vec!["SCAN", cursor.as_str()];
        args.extend_from_slice(extra);
        let r = run_on(s, shared, 1, &args);
        let lines: Vec<&str> = r.split("\r\n").collect();
        assert_eq!(lines[0], "*2", "{r}");
        let next = lines[2].to_string();
        let n: usize = lines[3][1..].parse().expect("count");
        for i in 0..n {
            keys.push(lines[5 + 2 * i].to_string());
        }
        cursor = next;
        if cursor == "0" {
            return keys;
        }
    }
}

#[test]
fn scan_returns_every_key_with_match_count_and_type() {
    let c = Conn::new(3);
    let mut s = RespConnState::new(&c.shared, 2);
    for i in 0..500 {
        let k = format!("k:{i}");
        run_on(&mut s, &c.shared, 1, &["SET", &k, "v"]);
    }
    let mut all = scan_all(&mut s, &c.shared, &[]);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 500);
    let mut some = scan_all(&mut s, &c.shared, &["MATCH", "k:1*", "COUNT", "7"]);
    some.sort();
    some.dedup();
    assert_eq!(some.len(), 1 + 10 + 100);
    assert!(scan_all(&mut s, &c.shared, &["TYPE", "hash"]).is_empty());
    assert_eq!(scan_all(&mut s, &c.shared, &["TYPE", "string"]).len(), 500);
    assert_eq!(
        run_on(&mut s, &c.shared, 1, &["SCAN", "x"]),
        "-ERR invalid cursor\r\n"
    );
    assert_eq!(
        run_on(&mut s, &c.shared, 1, &["SCAN", "0", "COUNT", "0"]),
        "-ERR syntax error\r\n"
    );
    assert!(scan_all(&mut s, &c.shared, &["TYPE", "blob"]).is_empty());
    assert_eq!(
        run_on(&mut s, &c.shared, 1, &["SCAN", "0", "MATCH"]),
        "-ERR syntax error\r\n"
    );
    // A cursor past the end just ends.
    assert_eq!(
        run_on(&mut s, &c.shared, 1, &["SCAN", "18446744073709551615"]),
        "*2\r\n$1\r\n0\r\n*0\r\n"
    );
}

#[test]
fn scan_sees_every_stable_key_while_others_write() {
    let c = Conn::new(4);
    let shared = &c.shared;
    let mut s = RespConnState::new(shared, 2);
    for i in 0..2000 {
        run_on(&mut s, shared, 1, &["SET", &format!("stable:{i}"), "v"]);
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for w in 0..2 {
            let stop = &stop;
            scope.spawn(move || {
                let mut ws = RespConnState::new(shared, 10 + w);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("churn:{w}:{}", i % 3000);
                    run_on(&mut ws, shared, 1, &["SET", &k, "x"]);
                    let old = format!("churn:{w}:{}", (i + 1500) % 3000);
                    run_on(&mut ws, shared, 1, &["DEL", &old]);
                    i += 1;
                }
            });
        }
        for _ in 0..5 {
            let keys = scan_all(&mut s, shared, &["COUNT", "20"]);
            let stable: std::collections::HashSet<&String> =
                keys.iter().filter(|k| k.starts_with("stable:")).collect();
            assert_eq!(stable.len(), 2000);
        }
        stop.store(true, Ordering::Relaxed);
    });
}

#[test]
fn multi_exec_discard_and_errors() {
    let mut c = Conn::new(4);
    c.expect_err(&["EXEC"], "EXEC without MULTI");
    c.expect_err(&["DISCARD"], "DISCARD without MULTI");
    assert_eq!(c.run(&["MULTI"]), "+OK\r\n");
    c.expect_err(&["MULTI"], "MULTI calls can not be nested");
    assert_eq!(c.run(&["SET", "a", "1"]), "+QUEUED\r\n");
    assert_eq!(c.run(&["INCR", "a"]), "+QUEUED\r\n");
    assert_eq!(c.run(&["MGET", "a", "b"]), "+QUEUED\r\n");
    assert_eq!(c.run(&["DBSIZE"]), "+QUEUED\r\n");
    assert_eq!(c.run(&["KEYS", "*"]), "+QUEUED\r\n");
    c.expect_err(&["WATCH", "a"], "WATCH inside MULTI is not allowed");
    assert_eq!(c.run(&["GET", "b"]), "+QUEUED\r\n");
    assert_eq!(
        c.run(&["EXEC"]),
        "*6\r\n+OK\r\n:2\r\n*2\r\n$1\r\n2\r\n$-1\r\n:1\r\n*1\r\n$1\r\na\r\n$-1\r\n"
    );
    // A run-time error is that command's reply only.
    c.run(&["MULTI"]);
    c.run(&["SET", "t", "text"]);
    c.run(&["INCR", "t"]);
    c.run(&["SET", "u", "1"]);
    assert_eq!(
        c.run(&["EXEC"]),
        "*3\r\n+OK\r\n-ERR value is not an integer or out of range\r\n+OK\r\n"
    );
    // Queue-time errors abort EXEC.
    c.run(&["MULTI"]);
    c.run(&["SET", "x", "1"]);
    assert!(c.run(&["NOSUCH"]).starts_with("-ERR unknown command"));
    c.expect_err(&["GET"], "wrong number of arguments for 'get' command");
    assert_eq!(
        c.run(&["EXEC"]),
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    assert_eq!(c.run(&["EXISTS", "x"]), ":0\r\n");
    // DISCARD drops the queue.
    c.run(&["MULTI"]);
    c.run(&["SET", "y", "1"]);
    assert_eq!(c.run(&["DISCARD"]), "+OK\r\n");
    assert_eq!(c.run(&["EXISTS", "y"]), ":0\r\n");
    c.expect_err(&["EXEC"], "EXEC without MULTI");
    // Empty transaction.
    c.run(&["MULTI"]);
    assert_eq!(c.run(&["EXEC"]), "*0\r\n");
}

#[test]
fn watch_aborts_exec_when_a_key_changed() {
    let mut c = Conn::new(4);
    let mut other = RespConnState::new(&c.shared, 2);
    c.run(&["SET", "w", "1"]);
    // Untouched: EXEC runs.
    assert_eq!(c.run(&["WATCH", "w", "absent"]), "+OK\r\n");
    c.run(&["MULTI"]);
    c.run(&["INCR", "w"]);
    assert_eq!(c.run(&["EXEC"]), "*1\r\n:2\r\n");
    // Written by another client: null array, nothing run.
    for write in [
        &["SET", "w", "9"][..],
        &["DEL", "w"][..],
        &["EXPIRE", "w", "100"][..],
        &["SET", "absent", "now"][..],
        &["FLUSHDB"][..],
        &["RENAME", "w", "w2"][..],
    ] {
        c.run(&["SET", "w", "1"]);
        c.run(&["DEL", "absent"]);
        assert_eq!(c.run(&["WATCH", "w", "absent"]), "+OK\r\n");
        let r = run_on(&mut other, &c.shared, 1, write);
        assert!(!r.starts_with('-'), "{write:?}: {r}");
        c.run(&["MULTI"]);
        c.run(&["SET", "w", "mine"]);
        assert_eq!(c.run(&["EXEC"]), "*-1\r\n", "after {write:?}");
        assert_ne!(c.run(&["GET", "w"]), bulk("mine"));
    }
    // Expired meanwhile.
    c.run(&["SET", "e", "1", "PX", "100"]);
    c.run(&["WATCH", "e"]);
    c.run(&["MULTI"]);
    c.run(&["SET", "e", "mine"]);
    c.now_ms += 200;
    assert_eq!(c.run(&["EXEC"]), "*-1\r\n");
    // UNWATCH forgets, and EXEC forgets too.
    c.run(&["WATCH", "w"]);
    run_on(&mut other, &c.shared, 1, &["SET", "w", "x"]);
    assert_eq!(c.run(&["UNWATCH"]), "+OK\r\n");
    c.run(&["MULTI"]);
    c.run(&["SET", "w", "mine"]);
    assert_eq!(c.run(&["EXEC"]), "*1\r\n+OK\r\n");
    // DISCARD unwatches.
    c.run(&["WATCH", "w"]);
    run_on(&mut other, &c.shared, 1, &["SET", "w", "y"]);
    c.run(&["MULTI"]);
    c.run(&["DISCARD"]);
    c.run(&["MULTI"]);
    c.run(&["SET", "w", "z"]);
    assert_eq!(c.run(&["EXEC"]), "*1\r\n+OK\r\n");
}

#[test]
fn transactions_are_refused_on_a_shard_and_bounded() {
    let (mut c, _dir) = with_shards();
    c.run(&["SELECT", "1"]);
    assert!(c.run(&["MULTI"]).starts_with("-ERR MULTI is not supported"));
    assert!(c
        .run(&["SETEX", "k", "1", "v"])
        .starts_with("-ERR SETEX is not supported on a persistent shard"));
    c.run(&["SELECT", "0"]);
    c.run(&["MULTI"]);
    assert!(c
        .run(&["SELECT", "1"])
        .starts_with("-ERR SELECT is not allowed"));
    assert!(c.run(&["EXEC"]).starts_with("-EXECABORT"));
    assert!(c
        .run(&["FLUSHALL"])
        .starts_with("-ERR FLUSHALL would erase"));
    // Over the queue bound the transaction is discarded.
    c.run(&["MULTI"]);
    let mut input = Vec::new();
    for _ in 0..crate::resp::txn::TXN_QUEUED_COMMANDS_MAX + 1 {
        input.extend_from_slice(&cmd(&[b"INCR", b"n"]));
    }
    let mut r = String::new();
    let mut at = 0;
    while at < input.len() {
        let mut out = Vec::new();
        let p = c.state.process(&c.shared, &input[at..], &mut out, 1);
        assert!(p.consumed > 0);
        at += p.consumed;
        r = String::from_utf8_lossy(&out).into_owned();
    }
    assert!(
        r.ends_with("-ERR transaction discarded: it would queue more than 100000 commands or 67108864 bytes\r\n"),
        "{}",
        &r[r.len().saturating_sub(200)..]
    );
    c.expect_err(&["EXEC"], "EXEC without MULTI");
    assert_eq!(c.run(&["EXISTS", "n"]), ":0\r\n");
}

#[test]
fn a_reader_never_sees_half_an_exec() {
    let c = Conn::new(4);
    let shared = &c.shared;
    let keys: Vec<String> = (1..=50).map(|i| format!("a{i}")).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let keys = &keys;
        let stop = &stop;
        let reader = scope.spawn(move || {
            let mut s = RespConnState::new(shared, 3);
            let mut mget = vec!["MGET"];
            mget.extend(keys.iter().map(String::as_str));
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) || reads < 100 {
                let r = run_on(&mut s, shared, 1, &mget);
                // Each value is `$-1` (not yet written) or `$3`, `gen`.
                let mut values = Vec::new();
                let mut lines = r.split("\r\n").skip(1);
                while let Some(l) = lines.next() {
                    match l {
                        "$-1" => values.push("nil"),
                        "" => {}
                        _ => values.push(lines.next().expect("bulk body")),
                    }
                }
                assert_eq!(values.len(), 50, "{r}");
                assert!(values.iter().all(|v| *v == values[0]), "torn read: {r}");
                reads += 1;
            }
        });
        let mut w = RespConnState::new(shared, 2);
        for gen in 0..300 {
            let g = format!("{gen:03}");
            let mut input = cmd(&[b"MULTI"]);
            for k in keys {
                input.extend_from_slice(&cmd(&[b"SET", k.as_bytes(), g.as_bytes()]));
            }
            input.extend_from_slice(&cmd(&[b"EXEC"]));
            let mut out = Vec::new();
            let p = w.process(shared, &input, &mut out, 1);
            assert_eq!(p.consumed, input.len());
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("reader");
    });
}

#[test]
fn info_and_dbsize_after_a_write_in_one_pipeline() {
    let mut c = Conn::new(2);
    let mut input = cmd(&[b"SET", b"k", b"v"]);
    input.extend_from_slice(&cmd(&[b"INFO", b"keyspace"]));
    input.extend_from_slice(&cmd(&[b"SET", b"k2", b"v"]));
    input.extend_from_slice(&cmd(&[b"DBSIZE"]));
    let (r, _) = c.feed(&input);
    assert!(r.ends_with(":2\r\n"), "{r}");
}

/// The integer of a `:n` reply.
fn int_of(reply: &str) -> i64 {
    reply
        .strip_prefix(':')
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or_else(|| panic!("not an integer reply: {reply:?}"))
}

/// Regression: PEXPIRETIME came back 1 ms early in some tries
/// after `SET x v PXAT T` or `PEXPIREAT x T` sent alone, because each
/// `process` call converted between the engine's clock and Unix time with
/// its own reading of the wall clock. Here the engine clock moves on its
/// own between calls (as a second read of it would), while the wall clock
/// barely moves: an absolute time must still come back exactly.
#[test]
fn absolute_expiry_round_trips_exactly_across_calls() {
    let mut c = Conn::new(2);
    c.now_ms = 1_000;
    assert_eq!(c.run(&["PING"]), "+PONG\r\n");
    for step in 0..50u64 {
        let t = unix_ms() + 3_600_000 + step as i64 * 7;
        let ts = t.to_string();
        c.now_ms += 1 + step % 3;
        assert_eq!(c.run(&["SET", "x", "v", "PXAT", &ts]), "+OK\r\n");
        c.now_ms += 1 + step % 2;
        assert_eq!(int_of(&c.run(&["PEXPIRETIME", "x"])), t, "step {step}");
        c.now_ms += 1;
        assert_eq!(c.run(&["PEXPIREAT", "x", &(t + 1).to_string()]), ":1\r\n");
        c.now_ms += 1 + step % 5;
        assert_eq!(int_of(&c.run(&["PEXPIRETIME", "x"])), t + 1, "step {step}");
        let secs = t / 1000 + 10;
        c.now_ms += 1;
        assert_eq!(c.run(&["EXPIREAT", "x", &secs.to_string()]), ":1\r\n");
        c.now_ms += 1;
        assert_eq!(int_of(&c.run(&["EXPIRETIME", "x"])), secs);
        assert_eq!(int_of(&c.run(&["PEXPIRETIME", "x"])), secs * 1000);
        c.now_ms += 1;
        assert_eq!(
            c.run(&["GETEX", "x", "PXAT", &(t + 5).to_string()]),
            bulk("v")
        );
        c.now_ms += 2;
        assert_eq!(int_of(&c.run(&["PEXPIRETIME", "x"])), t + 5);
    }
}

/// Regression: an absolute expiry more than 10 years ahead was
/// refused; Redis takes any time whose milliseconds fit an `i64`, and
/// refuses only one that overflows, with its own error.
#[test]
fn far_future_expiry_is_kept_as_redis_keeps_it() {
    let mut c = Conn::new(2);
    let max = i64::MAX.to_string();
    c.run(&["SET", "k", "v"]);
    assert_eq!(c.run(&["PEXPIREAT", "k", &max]), ":1\r\n");
    assert_eq!(c.run(&["PEXPIRETIME", "k"]), format!(":{max}\r\n"));
    assert_eq!(c.run(&["EXPIRETIME", "k"]), ":9223372036854776\r\n");
    assert_eq!(c.run(&["GET", "k"]), bulk("v"));
    assert_eq!(c.run(&["EXPIREAT", "k", "9223372036854775"]), ":1\r\n");
    assert_eq!(c.run(&["EXPIRETIME", "k"]), ":9223372036854775\r\n");
    c.expect_err(
        &["EXPIREAT", "k", "9223372036854776"],
        "invalid expire time in 'expireat' command",
    );
    assert_eq!(c.run(&["SET", "k", "v", "PXAT", &max]), "+OK\r\n");
    assert_eq!(c.run(&["PEXPIRETIME", "k"]), format!(":{max}\r\n"));
    assert_eq!(
        c.run(&["SET", "k", "v", "EXAT", "9223372036854775"]),
        "+OK\r\n"
    );
    assert_eq!(c.run(&["PEXPIRETIME", "k"]), ":9223372036854775000\r\n");
    c.expect_err(
        &["SET", "k", "v", "EXAT", "9223372036854776"],
        "invalid expire time in 'set' command",
    );
    c.expect_err(
        &["SET", "k", "v", "PX", &max],
        "invalid expire time in 'set' command",
    );
    c.expect_err(
        &["GETEX", "k", "EXAT", "9223372036854776"],
        "invalid expire time in 'getex' command",
    );
    // A hundred years, relative: past the old 10-year bound, kept.
    let century_s = 100 * 365 * 24 * 3600i64;
    assert_eq!(
        c.run(&["SETEX", "k", &century_s.to_string(), "v"]),
        "+OK\r\n"
    );
    assert_eq!(int_of(&c.run(&["TTL", "k"])), century_s);
    assert_eq!(
        c.run(&["EXPIRE", "k", &(2 * century_s).to_string()]),
        ":1\r\n"
    );
    assert_eq!(int_of(&c.run(&["TTL", "k"])), 2 * century_s);
    let at = unix_ms() + 1000 * century_s;
    assert_eq!(c.run(&["PEXPIREAT", "k", &at.to_string()]), ":1\r\n");
    assert_eq!(int_of(&c.run(&["PEXPIRETIME", "k"])), at);
}
