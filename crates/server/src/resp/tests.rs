//! The RESP commands, byte for byte, without sockets.

use std::sync::Arc;

use fabrickv_engine::{Mode as EngineMode, Partition, PartitionConfig};

use super::glob::stringmatch as glob_match;
use super::*;
use crate::partitions::Partitions;
use fabrickv_types::limits::KEY_BYTES_MAX;
use fabrickv_wire::shard_data::SHARD_DATA_KEY_BYTES_MAX;

fn shared_with(parts: usize, password: Option<&str>) -> RespShared {
    let p = (0..parts)
        .map(|_| {
            Partition::new(&PartitionConfig {
                mode: EngineMode::Store,
                pool_bytes: 8 << 20,
                index_buckets: None,
                memory: Default::default(),
            })
            .expect("partition")
        })
        .collect();
    RespShared::new(
        Arc::new(Partitions::new(p)),
        password,
        Mode::Store,
        (8 << 20) * parts as u64,
        7380,
    )
}

/// Encodes a command as redis-cli does (an array of bulk strings).
fn cmd(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

struct Conn {
    shared: RespShared,
    state: RespConnState,
    now_ms: u64,
}

impl Conn {
    fn new(parts: usize) -> Conn {
        Conn::with(shared_with(parts, None))
    }

    fn with(shared: RespShared) -> Conn {
        let state = RespConnState::new(&shared, 1);
        Conn {
            shared,
            state,
            now_ms: 1,
        }
    }

    /// Feeds bytes; returns the replies and whether the server closes.
    fn feed(&mut self, input: &[u8]) -> (String, bool) {
        let mut out = Vec::new();
        let mut at = 0;
        let mut close = false;
        while at < input.len() && !close {
            let p = self
                .state
                .process(&self.shared, &input[at..], &mut out, self.now_ms);
            at += p.consumed;
            close = p.close;
            if p.consumed == 0 {
                break;
            }
        }
        (String::from_utf8_lossy(&out).into_owned(), close)
    }

    fn run(&mut self, args: &[&str]) -> String {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.feed(&cmd(&a)).0
    }

    /// Runs `args` and checks that the reply is Redis's error `-ERR
    /// {message}`.
    #[track_caller]
    fn expect_err(&mut self, args: &[&str], message: &str) {
        assert_eq!(self.run(args), format!("-ERR {message}\r\n"), "{args:?}");
    }
}

/// On a replicating server, a connection's buffered replies are settled
/// (need not wait for a replication round) only while they are GETs and
/// MGETs of keys with no write in flight: a write, a read of a written
/// key, a read inside EXEC and any other command are not.
#[test]
fn only_gets_of_settled_keys_leave_replies_settled() {
    use crate::partitions::journaled;
    let (partitions, seqs) = journaled::two();
    let a = journaled::key_in(&partitions, 0, "k");
    let b = journaled::key_in(&partitions, 1, "k");
    let shared = RespShared::new(partitions, None, Mode::Store, 8 << 20, 7380);
    let mut c = Conn::with(shared);
    let settled = |c: &mut Conn, cmds: &[&[&str]]| {
        c.state.replies_unsettled = false;
        for args in cmds {
            c.run(args);
        }
        !c.state.replies_unsettled
    };
    assert!(settled(&mut c, &[&["GET", &a]]), "nothing written yet");
    assert!(!settled(&mut c, &[&["SET", &a, "v"]]), "a write");
    assert!(!settled(&mut c, &[&["GET", &a]]), "its write is in flight");
    assert!(settled(&mut c, &[&["GET", &b]]), "another partition");
    assert!(
        !settled(&mut c, &[&["GET", &b], &["GET", &a]]),
        "one unsettled GET among settled ones"
    );
    assert!(!settled(&mut c, &[&["PING"]]), "not a GET");
    assert!(
        settled(&mut c, &[&["MGET", &b, &b]]),
        "an MGET of quiet keys"
    );
    assert!(
        !settled(&mut c, &[&["MGET", &b, &a]]),
        "an MGET with one key written"
    );
    seqs[0].mark_replicated(seqs[0].get());
    assert!(settled(&mut c, &[&["GET", &a]]), "its write replicated");
    assert!(
        settled(&mut c, &[&["MGET", &a, &b]]),
        "every key replicated"
    );
    assert!(
        !settled(&mut c, &[&["MULTI"], &["MGET", &a, &b], &["EXEC"]]),
        "an MGET in a transaction"
    );
    assert!(
        !settled(&mut c, &[&["MULTI"], &["GET", &a], &["EXEC"]]),
        "a transaction"
    );
    assert!(!settled(&mut c, &[&["GET", "a", "b"]]), "refused");
}

#[test]
fn ping_echo_and_set_get() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["PING"]), "+PONG\r\n");
    assert_eq!(c.run(&["ping", "hi"]), "$2\r\nhi\r\n");
    assert_eq!(c.run(&["ECHO", "x y"]), "$3\r\nx y\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$-1\r\n");
    assert_eq!(c.run(&["SET", "k", "v1"]), "+OK\r\n");
    assert_eq!(c.run(&["get", "k"]), "$2\r\nv1\r\n");
    assert_eq!(c.run(&["STRLEN", "k"]), ":2\r\n");
    // Binary-safe: CRLF and NUL inside a value.
    c.feed(&cmd(&[b"SET", b"bin", b"a\r\n\0b"]));
    assert_eq!(c.run(&["GET", "bin"]), "$5\r\na\r\n\0b\r\n");
    assert_eq!(c.run(&["SET", "e", ""]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "e"]), "$0\r\n\r\n");
}

#[test]
fn set_conditions_and_get_option() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["SET", "k", "a", "XX"]), "$-1\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$-1\r\n");
    assert_eq!(c.run(&["SET", "k", "a", "NX"]), "+OK\r\n");
    assert_eq!(c.run(&["SET", "k", "b", "nx"]), "$-1\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$1\r\na\r\n");
    assert_eq!(c.run(&["SET", "k", "c", "XX"]), "+OK\r\n");
    assert_eq!(c.run(&["SET", "k", "d", "GET"]), "$1\r\nc\r\n");
    assert_eq!(c.run(&["SET", "new", "d", "GET"]), "$-1\r\n");
    assert_eq!(c.run(&["GET", "new"]), "$1\r\nd\r\n");
    c.expect_err(&["SET", "k", "v", "NX", "XX"], "syntax error");
    c.expect_err(&["SET", "k", "v", "EX"], "syntax error");
    c.expect_err(&["SET", "k", "v", "BOGUS"], "syntax error");
    c.expect_err(&["SET", "k", "v", "EX", "1", "PX", "5"], "syntax error");
    assert_eq!(
        c.run(&["GET", "k"]),
        "$1\r\nd\r\n",
        "refused SETs wrote nothing"
    );
}

#[test]
fn ttl_expire_persist() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["TTL", "k"]), ":-2\r\n");
    c.run(&["SET", "k", "v", "EX", "10"]);
    assert_eq!(c.run(&["TTL", "k"]), ":10\r\n");
    assert_eq!(c.run(&["PTTL", "k"]), ":10000\r\n");
    c.now_ms += 4_000;
    assert_eq!(c.run(&["TTL", "k"]), ":6\r\n");
    // SET without KEEPTTL clears the TTL; KEEPTTL keeps it.
    c.run(&["SET", "k", "v2", "PX", "5000"]);
    c.run(&["SET", "k", "v3", "KEEPTTL"]);
    assert_eq!(c.run(&["PTTL", "k"]), ":5000\r\n");
    c.run(&["SET", "k", "v4"]);
    assert_eq!(c.run(&["TTL", "k"]), ":-1\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "3"]), ":1\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "100", "NX"]), ":0\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "100", "GT"]), ":1\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "5", "GT"]), ":0\r\n");
    assert_eq!(c.run(&["EXPIRE", "k", "5", "LT"]), ":1\r\n");
    assert_eq!(c.run(&["TTL", "k"]), ":5\r\n");
    assert_eq!(c.run(&["PERSIST", "k"]), ":1\r\n");
    assert_eq!(c.run(&["PERSIST", "k"]), ":0\r\n");
    assert_eq!(c.run(&["TTL", "k"]), ":-1\r\n");
    assert_eq!(c.run(&["PEXPIRE", "k", "1500"]), ":1\r\n");
    c.now_ms += 1_499;
    assert_eq!(c.run(&["GET", "k"]), "$2\r\nv4\r\n");
    c.now_ms += 1;
    assert_eq!(c.run(&["GET", "k"]), "$-1\r\n", "expired at its deadline");
    assert_eq!(c.run(&["EXPIRE", "k", "5"]), ":0\r\n", "absent key");
    // A non-positive time deletes the key.
    c.run(&["SET", "k", "v"]);
    assert_eq!(c.run(&["EXPIRE", "k", "0"]), ":1\r\n");
    assert_eq!(c.run(&["EXISTS", "k"]), ":0\r\n");
    // Refused: not above 0, or milliseconds past i64 (as Redis; ten years
    // and more is kept, see `far_future_expiry_is_kept_as_redis_keeps_it`).
    for bad in ["0", "-5", "9223372036854776"] {
        assert_eq!(
            c.run(&["SET", "k", "v", "EX", bad]),
            "-ERR invalid expire time in 'set' command\r\n",
            "EX {bad}"
        );
    }
    c.expect_err(
        &["SET", "k", "v", "EX", "ten"],
        "value is not an integer or out of range",
    );
}

#[test]
fn multi_key_commands_across_partitions() {
    let mut c = Conn::new(4);
    let mut args = vec!["MSET"];
    let keys: Vec<String> = (0..40).map(|i| format!("key:{i}")).collect();
    let values: Vec<String> = (0..40).map(|i| format!("value-{i}")).collect();
    for (k, v) in keys.iter().zip(&values) {
        args.push(k);
        args.push(v);
    }
    assert_eq!(c.run(&args), "+OK\r\n");
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(String::as_str));
    mget.push("missing");
    let mut want = format!("*{}\r\n", keys.len() + 1);
    for v in &values {
        want.push_str(&format!("${}\r\n{v}\r\n", v.len()));
    }
    want.push_str("$-1\r\n");
    assert_eq!(c.run(&mget), want);
    assert_eq!(
        c.run(&["EXISTS", "key:1", "key:1", "key:2", "nope"]),
        ":3\r\n"
    );
    assert_eq!(c.run(&["DEL", "key:1", "key:2", "nope"]), ":2\r\n");
    assert_eq!(c.run(&["DBSIZE"]), ":38\r\n");
    c.expect_err(
        &["MSET", "a", "1", "b"],
        "wrong number of arguments for 'mset' command",
    );
}

#[test]
fn incr_family() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["INCR", "n"]), ":1\r\n");
    assert_eq!(c.run(&["INCRBY", "n", "41"]), ":42\r\n");
    assert_eq!(c.run(&["DECR", "n"]), ":41\r\n");
    assert_eq!(c.run(&["DECRBY", "n", "50"]), ":-9\r\n");
    assert_eq!(c.run(&["GET", "n"]), "$2\r\n-9\r\n");
    c.run(&["SET", "s", "abc"]);
    let not_int = "-ERR value is not an integer or out of range\r\n";
    assert_eq!(c.run(&["INCR", "s"]), not_int);
    assert_eq!(c.run(&["INCRBY", "n", "1.5"]), not_int);
    assert_eq!(c.run(&["DECRBY", "n", "-9223372036854775808"]), not_int);
    c.run(&["SET", "big", "9223372036854775807"]);
    c.expect_err(&["INCR", "big"], "increment or decrement would overflow");
    assert_eq!(c.run(&["GET", "big"]), "$19\r\n9223372036854775807\r\n");
    // INCR keeps the TTL, as Redis does.
    c.run(&["SET", "t", "1", "EX", "100"]);
    c.run(&["INCR", "t"]);
    assert_eq!(c.run(&["TTL", "t"]), ":100\r\n");
}

#[test]
fn errors_for_unknown_commands_arity_and_long_keys() {
    let mut c = Conn::new(1);
    c.expect_err(
        &["FOO", "a", "b"],
        "unknown command 'FOO', with args beginning with: 'a' 'b' ",
    );
    c.expect_err(&["GET"], "wrong number of arguments for 'get' command");
    c.expect_err(
        &["GET", "a", "b"],
        "wrong number of arguments for 'get' command",
    );
    let long = "k".repeat(KEY_BYTES_MAX + 1);
    assert!(c
        .run(&["SET", &long, "v"])
        .starts_with("-ERR key is 251 bytes"));
    assert_eq!(c.run(&["GET", &long]).lines().count(), 1);
    // An error message never carries a line break from the client.
    let out = c.run(&["BAD\r\nINJECT"]);
    assert_eq!(out.matches("\r\n").count(), 1, "{out:?}");
    c.expect_err(&["SELECT", "1"], "DB index is out of range");
    assert_eq!(c.run(&["SELECT", "0"]), "+OK\r\n");
}

#[test]
fn auth_is_required_when_a_password_is_set() {
    let mut c = Conn::with(shared_with(1, Some("s3cret")));
    assert_eq!(c.run(&["GET", "k"]), "-NOAUTH Authentication required.\r\n");
    assert_eq!(c.run(&["PING"]), "-NOAUTH Authentication required.\r\n");
    assert_eq!(
        c.run(&["AUTH", "wrong"]),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(
        c.run(&["AUTH", "other", "s3cret"]),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(c.run(&["AUTH", "default", "s3cret"]), "+OK\r\n");
    assert_eq!(c.run(&["PING"]), "+PONG\r\n");
    let mut open = Conn::new(1);
    assert!(open
        .run(&["AUTH", "x"])
        .starts_with("-ERR AUTH <password> called"));
}

#[test]
fn pipelined_input_split_anywhere_gives_the_same_replies() {
    let mut input = Vec::new();
    for i in 0..20 {
        let k = format!("k{i}");
        input.extend(cmd(&[b"SET", k.as_bytes(), format!("v{i}").as_bytes()]));
        input.extend(cmd(&[b"GET", k.as_bytes()]));
    }
    input.extend_from_slice(b"PING\r\nECHO \"a b\"\r\n\r\n");
    let whole = Conn::new(2).feed(&input).0;
    assert!(whole.ends_with("+PONG\r\n$3\r\na b\r\n"), "{whole:?}");
    for cut in [1, 2, 7, 13, 64, 255] {
        // Feed in pieces the way a socket delivers them, keeping what the
        // connection state did not consume.
        let mut c = Conn::new(2);
        let mut out = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        for chunk in input.chunks(cut) {
            pending.extend_from_slice(chunk);
            loop {
                let p = c.state.process(&c.shared, &pending, &mut out, 1);
                pending.drain(..p.consumed);
                assert!(p.need == 0 || p.need > pending.len());
                if p.consumed == 0 {
                    break;
                }
            }
        }
        assert!(pending.is_empty());
        assert_eq!(String::from_utf8_lossy(&out), whole, "chunks of {cut}");
    }
}

#[test]
fn protocol_errors_and_quit_close_the_connection() {
    let mut c = Conn::new(1);
    let (out, close) = c.feed(b"*1\r\n$x\r\n");
    assert!(out.starts_with("-ERR Protocol error"), "{out:?}");
    assert!(close);
    let mut c = Conn::new(1);
    let (out, close) = c.feed(b"PING\r\nQUIT\r\nPING\r\n");
    assert_eq!(out, "+PONG\r\n+OK\r\n");
    assert!(close, "nothing after QUIT runs");
}

#[test]
fn output_backpressure_stops_execution() {
    let mut c = Conn::new(1);
    let big = vec![b'x'; 64 << 10];
    c.feed(&cmd(&[b"SET", b"big", &big]));
    let mut input = Vec::new();
    for _ in 0..16 {
        input.extend(cmd(&[b"GET", b"big"]));
    }
    let mut out = Vec::new();
    let p = c.state.process(&c.shared, &input, &mut out, 1);
    assert!(p.consumed < input.len(), "stopped with commands left");
    assert!(out.len() >= RESP_OUTPUT_SOFT_BYTES);
    assert!(out.len() < RESP_OUTPUT_SOFT_BYTES + (70 << 10));
}

#[test]
fn config_info_command_client() {
    let mut c = Conn::new(1);
    assert_eq!(
        c.run(&["CONFIG", "GET", "save"]),
        "*2\r\n$4\r\nsave\r\n$0\r\n\r\n"
    );
    assert_eq!(
        c.run(&["CONFIG", "GET", "appendonly"]),
        "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
    );
    assert_eq!(c.run(&["CONFIG", "GET", "nothing*"]), "*0\r\n");
    let many = c.run(&["CONFIG", "GET", "*max*"]);
    // maxmemory, maxmemory-policy, maxmemory-clients, maxclients and
    // proto-max-bulk-len.
    assert!(many.starts_with("*10\r\n"), "{many:?}");
    let stars = format!("{}x", "*".repeat(5000));
    assert_eq!(c.run(&["CONFIG", "GET", &stars]), "*0\r\n");
    assert!(c.run(&["CONFIG", "SET", "save", ""]).starts_with("-ERR"));
    c.run(&["SET", "a", "1"]);
    let info = c.run(&["INFO"]);
    assert!(info.contains("redis_version:"), "{info}");
    assert!(info.contains("db0:keys=1"), "{info}");
    let ks = c.run(&["INFO", "keyspace"]);
    assert!(ks.contains("db0:keys=1") && !ks.contains("redis_version"));
    assert_eq!(c.run(&["CLIENT", "SETNAME", "x"]), "+OK\r\n");
    assert_eq!(c.run(&["CLIENT", "ID"]), ":1\r\n");
    assert!(c
        .run(&["COMMAND", "DOCS"])
        .starts_with(&format!("*{}\r\n", 2 * COMMANDS.len())));
}

#[test]
fn glob_matches_like_redis() {
    assert!(glob_match(b"*", b"save"));
    assert!(glob_match(b"s?ve", b"save"));
    assert!(glob_match(b"max*", b"maxmemory-policy"));
    assert!(glob_match(b"*memory*", b"maxmemory"));
    assert!(!glob_match(b"save?", b"save"));
    assert!(!glob_match(b"a*b", b"acd"));
    assert!(glob_match(b"", b""));
}

/// A connection to a front-end serving two shards (db 1 and db 2) in a
/// temporary directory, beside the in-memory kv (db 0).
fn with_shards() -> (Conn, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let specs: Vec<crate::shard::ShardSpec> = ["first", "second"]
        .iter()
        .map(|n| crate::shard::ShardSpec {
            name: n.to_string(),
            path: dir.path().join(n),
        })
        .collect();
    let shards = crate::shard::Shards::open_for_tests(&specs);
    (Conn::with(shared_with(1, None).with_shards(&shards)), dir)
}

#[test]
fn select_picks_the_kv_or_a_shard() {
    let (mut c, _dir) = with_shards();
    assert_eq!(c.run(&["SET", "k", "kv"]), "+OK\r\n");
    assert_eq!(c.run(&["SELECT", "1"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$-1\r\n", "db 1 is not the kv");
    assert_eq!(c.run(&["SET", "k", "one"]), "+OK\r\n");
    assert_eq!(c.run(&["SELECT", "2"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$-1\r\n", "db 2 is another shard");
    assert_eq!(c.run(&["SET", "k", "two"]), "+OK\r\n");
    c.expect_err(&["SELECT", "3"], "DB index is out of range");
    c.expect_err(&["SELECT", "-1"], "DB index is out of range");
    c.expect_err(&["SELECT", "x"], "value is not an integer or out of range");
    assert_eq!(
        c.run(&["GET", "k"]),
        "$3\r\ntwo\r\n",
        "a refused SELECT keeps db 2"
    );
    assert_eq!(c.run(&["SELECT", "1"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$3\r\none\r\n");
    assert_eq!(c.run(&["SELECT", "0"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", "k"]), "$2\r\nkv\r\n");
    assert_eq!(
        c.run(&["CONFIG", "GET", "databases"]),
        "*2\r\n$9\r\ndatabases\r\n$1\r\n3\r\n"
    );
    let ks = c.run(&["INFO", "keyspace"]);
    assert!(ks.contains("db1:keys=") && ks.contains("db2:keys="), "{ks}");
}

#[test]
fn data_commands_on_a_shard() {
    let (mut c, _dir) = with_shards();
    assert_eq!(c.run(&["SELECT", "1"]), "+OK\r\n");
    assert_eq!(c.run(&["STRLEN", "a"]), ":0\r\n");
    assert_eq!(
        c.run(&["MSET", "a", "1", "b", "22", "", "empty key"]),
        "+OK\r\n"
    );
    assert_eq!(c.run(&["GET", ""]), "$9\r\nempty key\r\n");
    assert_eq!(c.run(&["STRLEN", "b"]), ":2\r\n");
    assert_eq!(
        c.run(&["MGET", "a", "nope", "b"]),
        "*3\r\n$1\r\n1\r\n$-1\r\n$2\r\n22\r\n"
    );
    assert_eq!(c.run(&["EXISTS", "a", "a", "nope"]), ":2\r\n");
    c.feed(&cmd(&[b"SET", b"bin", b"a\r\n\0b"]));
    assert_eq!(c.run(&["GET", "bin"]), "$5\r\na\r\n\0b\r\n");
    assert_eq!(c.run(&["DEL", "a", "a", "nope", ""]), ":2\r\n");
    assert_eq!(c.run(&["EXISTS", "a", ""]), ":0\r\n");
    assert_eq!(c.run(&["DEL", "a"]), ":0\r\n");
    c.expect_err(
        &["MSET", "a"],
        "wrong number of arguments for 'mset' command",
    );
    // Keys up to the shard's bound, longer than the kv's.
    let long = "k".repeat(1000);
    assert_eq!(c.run(&["SET", &long, "v"]), "+OK\r\n");
    assert_eq!(c.run(&["GET", &long]), "$1\r\nv\r\n");
    let too_long = "k".repeat(SHARD_DATA_KEY_BYTES_MAX + 1);
    assert_eq!(
        c.run(&["MSET", "fresh", "v", &too_long, "v"]),
        format!(
            "-ERR key is {} bytes; shard keys are at most {SHARD_DATA_KEY_BYTES_MAX} bytes\r\n",
            SHARD_DATA_KEY_BYTES_MAX + 1
        )
    );
    assert_eq!(
        c.run(&["GET", "fresh"]),
        "$-1\r\n",
        "a refused MSET wrote nothing"
    );
}

#[test]
fn shard_limitations_are_named() {
    let (mut c, _dir) = with_shards();
    c.run(&["SELECT", "2"]);
    c.expect_err(&["SET", "k", "v", "NX"], "SET options (NX, XX, GET, EX, PX, EXAT, PXAT, KEEPTTL) are not supported on a persistent shard (db 2): only a plain SET key value");
    assert_eq!(
        c.run(&["GET", "k"]),
        "$-1\r\n",
        "a refused SET wrote nothing"
    );
    c.expect_err(
        &["EXPIRE", "k", "10"],
        "'expire' is not supported on a persistent shard (db 2): shard keys do not expire",
    );
    c.expect_err(
        &["TTL", "k"],
        "'ttl' is not supported on a persistent shard (db 2): shard keys do not expire",
    );
    c.expect_err(&["INCR", "k"], "'incr' is not supported on a persistent shard (db 2): shards store plain values, not counters");
    assert!(c
        .run(&["DBSIZE"])
        .starts_with("-ERR 'dbsize' is not supported on a persistent shard (db 2)"));
    // Commands about the connection still work.
    assert_eq!(c.run(&["PING"]), "+PONG\r\n");
    // Arity is checked first, as on db 0.
    c.expect_err(&["GET"], "wrong number of arguments for 'get' command");
}

#[test]
fn without_shards_only_db_0_exists() {
    let mut c = Conn::new(1);
    c.expect_err(&["SELECT", "1"], "DB index is out of range");
    assert_eq!(
        c.run(&["CONFIG", "GET", "databases"]),
        "*2\r\n$9\r\ndatabases\r\n$1\r\n1\r\n"
    );
}

fn cluster_secret() -> fabrickv_auth::Secret {
    fabrickv_auth::Secret::from_bytes(b"resp-cluster-secret-0123", "test").expect("secret")
}

#[test]
fn auth_takes_the_cluster_secret_when_no_password_is_set() {
    let mut c = Conn::with(shared_with(1, None).with_secret(Some(cluster_secret())));
    assert_eq!(c.run(&["GET", "k"]), "-NOAUTH Authentication required.\r\n");
    assert_eq!(
        c.run(&["AUTH", "resp-cluster-secret-0124"]),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(
        c.run(&["AUTH", "default", "resp-cluster-secret-0123"]),
        "+OK\r\n"
    );
    assert_eq!(c.run(&["PING"]), "+PONG\r\n");
    let mut c = Conn::with(shared_with(1, None).with_secret(Some(cluster_secret())));
    assert_eq!(c.run(&["AUTH", "resp-cluster-secret-0123"]), "+OK\r\n");
}

#[test]
fn a_separate_resp_password_is_the_only_one_auth_takes() {
    let shared = shared_with(1, Some("s3cret")).with_secret(Some(cluster_secret()));
    let mut c = Conn::with(shared);
    assert_eq!(
        c.run(&["AUTH", "resp-cluster-secret-0123"]),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(c.run(&["AUTH", "s3cret"]), "+OK\r\n");
}

#[test]
fn each_failed_auth_holds_the_connection_longer_and_is_counted() {
    let mut c = Conn::with(shared_with(1, Some("s3cret")));
    let mut delays = Vec::new();
    for _ in 0..8 {
        let mut out = Vec::new();
        let p = c
            .state
            .process(&c.shared, &cmd(&[b"AUTH", b"nope"]), &mut out, c.now_ms);
        let until = p.hold_until_ms.expect("a failed AUTH holds the connection");
        delays.push(until - c.now_ms);
    }
    assert_eq!(delays[0], crate::resp::RESP_AUTH_DELAY_BASE_MS);
    assert!(delays.windows(2).all(|w| w[1] >= w[0]), "{delays:?}");
    assert_eq!(delays[1], 2 * delays[0]);
    assert_eq!(
        *delays.last().expect("delays"),
        crate::resp::RESP_AUTH_DELAY_MAX_MS
    );
    // Commands after a failed AUTH in the same read wait for the hold.
    let mut out = Vec::new();
    let mut input = cmd(&[b"AUTH", b"nope"]);
    input.extend(cmd(&[b"PING"]));
    let p = c.state.process(&c.shared, &input, &mut out, c.now_ms);
    assert!(p.hold_until_ms.is_some());
    assert!(p.consumed < input.len(), "PING is left for after the hold");
    assert_eq!(c.run(&["AUTH", "s3cret"]), "+OK\r\n");
    let info = c.run(&["INFO", "stats"]);
    assert!(info.contains("acl_access_denied_auth:9\r\n"), "{info}");
}

/// Fault 10 of the attack run: the in-memory kv took the empty key over
/// RESP while the native protocol refuses it (`KEY_TOO_LONG`); one rule
/// for both now.
#[test]
fn the_empty_key_is_refused_as_natively() {
    let mut c = Conn::new(1);
    let refused = format!("-ERR empty key; FabricKV keys are 1 to {KEY_BYTES_MAX} bytes\r\n");
    for args in [
        &["SET", "", "v"][..],
        &["GET", ""],
        &["INCR", ""],
        &["STRLEN", ""],
        &["EXPIRE", "", "10"],
        &["TTL", ""],
        &["PERSIST", ""],
        &["MSET", "a", "1", "", "2"],
    ] {
        assert_eq!(c.run(args), refused, "{args:?}");
    }
    // Commands over many keys treat it as a key that cannot exist, as
    // they do a key over the bound.
    assert_eq!(c.run(&["MGET", ""]), "*1\r\n$-1\r\n");
    assert_eq!(c.run(&["EXISTS", ""]), ":0\r\n");
    assert_eq!(c.run(&["DEL", ""]), ":0\r\n");
    assert_eq!(c.run(&["DBSIZE"]), ":0\r\n");
}

mod cluster;
mod cmds;
mod scan;

/// The `$len` bulk of `s`, for building expected replies.
fn b(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn hello_map(proto: i64, id: u64, resp3: bool) -> String {
    let head = if resp3 { "%7\r\n" } else { "*14\r\n" };
    format!(
        "{head}{}{}{}{}{}:{proto}\r\n{}:{id}\r\n{}{}{}{}{}*0\r\n",
        b("server"),
        b("redis"),
        b("version"),
        b(crate::resp::REDIS_VERSION),
        b("proto"),
        b("id"),
        b("mode"),
        b("standalone"),
        b("role"),
        b("master"),
        b("modules"),
    )
}

#[test]
fn hello_switches_the_protocol_and_resp3_replies_follow() {
    let mut c = Conn::new(1);
    // HELLO alone answers in the current protocol and keeps it.
    assert_eq!(c.run(&["HELLO"]), hello_map(2, 1, false));
    assert_eq!(c.run(&["HELLO", "2"]), hello_map(2, 1, false));
    assert_eq!(
        c.run(&["HELLO", "4"]),
        "-NOPROTO unsupported protocol version\r\n"
    );
    c.expect_err(
        &["HELLO", "x"],
        "Protocol version is not an integer or out of range",
    );
    c.expect_err(
        &["HELLO", "3", "BOGUS"],
        "Syntax error in HELLO option 'BOGUS'",
    );
    // Still RESP2 after the errors.
    assert_eq!(c.run(&["GET", "nope"]), "$-1\r\n");
    assert_eq!(c.run(&["HELLO", "3"]), hello_map(3, 1, true));
    // RESP3: null, maps, verbatim strings.
    assert_eq!(c.run(&["GET", "nope"]), "_\r\n");
    c.run(&["SET", "a", "1"]);
    assert_eq!(c.run(&["MGET", "a", "nope"]), "*2\r\n$1\r\n1\r\n_\r\n");
    assert_eq!(c.run(&["SET", "a", "2", "NX"]), "_\r\n");
    assert_eq!(
        c.run(&["CONFIG", "GET", "appendonly"]),
        "%1\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
    );
    let info = c.run(&["INFO", "keyspace"]);
    assert!(info.starts_with('='), "{info:?}");
    assert!(info.contains("\r\ntxt:# Keyspace\r\n"), "{info:?}");
    let me = c.run(&["CLIENT", "INFO"]);
    assert!(me.starts_with('=') && me.contains("txt:id=1 "), "{me:?}");
    assert!(me.contains(" resp=3 "), "{me:?}");
    assert_eq!(c.run(&["CLIENT", "GETNAME"]), "_\r\n");
    // Back to RESP2, with a name.
    assert_eq!(
        c.run(&["HELLO", "2", "SETNAME", "back"]),
        hello_map(2, 1, false)
    );
    assert_eq!(c.run(&["CLIENT", "GETNAME"]), "$4\r\nback\r\n");
    assert_eq!(c.run(&["GET", "nope"]), "$-1\r\n");
}

#[test]
fn hello_authenticates_like_auth() {
    let mut c = Conn::with(shared_with(1, Some("s3cret")));
    let noauth = "-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n";
    assert_eq!(c.run(&["HELLO", "3"]), noauth);
    assert_eq!(c.run(&["HELLO"]), noauth);
    // A wrong password is WRONGPASS, counted and held like AUTH's.
    let mut out = Vec::new();
    let p = c.state.process(
        &c.shared,
        &cmd(&[b"HELLO", b"3", b"AUTH", b"default", b"nope"]),
        &mut out,
        c.now_ms,
    );
    assert_eq!(
        out,
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(
        p.hold_until_ms,
        Some(c.now_ms + crate::resp::RESP_AUTH_DELAY_BASE_MS)
    );
    assert_eq!(c.run(&["GET", "k"]), "-NOAUTH Authentication required.\r\n");
    assert_eq!(
        c.run(&["HELLO", "3", "AUTH", "default", "s3cret", "SETNAME", "py"]),
        hello_map(3, 1, true)
    );
    assert_eq!(c.run(&["GET", "k"]), "_\r\n");
    assert_eq!(c.run(&["CLIENT", "GETNAME"]), "$2\r\npy\r\n");
    let stats = c.run(&["INFO", "stats"]);
    assert!(stats.contains("acl_access_denied_auth:1\r\n"), "{stats}");
}

#[test]
fn behaviour_fixes_match_redis() {
    let mut c = Conn::new(1);
    c.expect_err(
        &["PING", "x", "y", "z"],
        "wrong number of arguments for 'ping' command",
    );
    c.expect_err(
        &["CLIENT", "SETNAME", "foo bar"],
        "Client names cannot contain spaces, newlines or special characters.",
    );
    c.expect_err(
        &["CLIENT", "SETNAME", "a\nb"],
        "Client names cannot contain spaces, newlines or special characters.",
    );
    let mut p = Conn::with(shared_with(1, Some("pw")));
    p.expect_err(&["AUTH", "a", "b", "c"], "syntax error");
    // An unauthenticated client announcing 100 arguments is refused at
    // once, before they arrive, and closed.
    let (reply, close) = p.feed(b"*100\r\n");
    assert_eq!(
        reply,
        "-ERR Protocol error: unauthenticated multibulk length\r\n"
    );
    assert!(close);
    let mut p = Conn::with(shared_with(1, Some("pw")));
    let (reply, close) = p.feed(b"*2\r\n$4\r\nAUTH\r\n$20000\r\n");
    assert_eq!(
        reply,
        "-ERR Protocol error: unauthenticated bulk length\r\n"
    );
    assert!(close);
    // Once authenticated, the same header just waits for its arguments.
    let mut p = Conn::with(shared_with(1, Some("pw")));
    assert_eq!(p.run(&["AUTH", "pw"]), "+OK\r\n");
    assert_eq!(p.feed(b"*100\r\n"), (String::new(), false));
}

#[test]
fn command_info_describes_get_as_redis_does() {
    let mut c = Conn::new(1);
    let get = "*10\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n\
*3\r\n+@read\r\n+@string\r\n+@fast\r\n*0\r\n\
*1\r\n*6\r\n$5\r\nflags\r\n*2\r\n+RO\r\n+access\r\n\
$12\r\nbegin_search\r\n*4\r\n$4\r\ntype\r\n$5\r\nindex\r\n$4\r\nspec\r\n*2\r\n$5\r\nindex\r\n:1\r\n\
$9\r\nfind_keys\r\n*4\r\n$4\r\ntype\r\n$5\r\nrange\r\n$4\r\nspec\r\n\
*6\r\n$7\r\nlastkey\r\n:0\r\n$7\r\nkeystep\r\n:1\r\n$5\r\nlimit\r\n:0\r\n*0\r\n";
    assert_eq!(c.run(&["COMMAND", "INFO", "get"]), format!("*1\r\n{get}"));
    assert_eq!(
        c.run(&["COMMAND", "INFO", "nosuch", "GET"]),
        format!("*2\r\n$-1\r\n{get}")
    );
    let n = COMMANDS.len();
    assert_eq!(c.run(&["COMMAND", "COUNT"]), format!(":{n}\r\n"));
    // The table gathered from every command file finds each command at
    // its place, GET and SET (looked up without a scan) included, and
    // names each once.
    for (i, spec) in COMMANDS.iter().enumerate() {
        assert_eq!(
            table::lookup_index(spec.name.as_bytes()),
            Some(i),
            "{}",
            spec.name
        );
    }
    let list = c.run(&["COMMAND", "LIST"]);
    assert!(
        list.starts_with(&format!("*{n}\r\n$3\r\nget\r\n")),
        "{list}"
    );
    assert!(c.run(&["COMMAND"]).starts_with(&format!("*{n}\r\n*10\r\n")));
    assert_eq!(
        c.run(&["COMMAND", "GETKEYS", "MSET", "a", "1", "b", "2"]),
        "*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    );
    assert_eq!(
        c.run(&["COMMAND", "GETKEYS", "get", "k"]),
        "*1\r\n$1\r\nk\r\n"
    );
    assert_eq!(
        c.run(&["COMMAND", "GETKEYS", "DEL", "a", "b", "c"]),
        "*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"
    );
    c.expect_err(
        &["COMMAND", "GETKEYS", "ping"],
        "The command has no key arguments",
    );
    c.expect_err(
        &["COMMAND", "GETKEYS", "nosuch", "x"],
        "Invalid command specified",
    );
    c.expect_err(
        &["COMMAND", "GETKEYS", "get"],
        "Invalid number of arguments specified for command",
    );
    let docs = c.run(&["COMMAND", "DOCS", "get"]);
    assert!(
        docs.starts_with("*2\r\n$3\r\nget\r\n*8\r\n$7\r\nsummary\r\n"),
        "{docs}"
    );
    // Every table entry's key positions agree with its key spec.
    for spec in COMMANDS {
        assert_eq!(
            spec.first_key > 0,
            !spec.key_specs.is_empty(),
            "{}",
            spec.name
        );
        if let Some(first) = spec.key_specs.first() {
            assert_eq!(first.index, spec.first_key, "{}", spec.name);
        }
        for ks in spec.key_specs {
            assert!(ks.index >= spec.first_key, "{}", spec.name);
            assert_eq!(ks.keystep, spec.step, "{}", spec.name);
        }
    }
}

#[test]
fn client_registry_lists_names_and_kills() {
    let shared = shared_with(1, None);
    let mut a = RespConnState::new(&shared, 1);
    let mut b = RespConnState::new(&shared, 2);
    let run = |s: &mut RespConnState, args: &[&str]| {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let mut out = Vec::new();
        let p = s.process(&shared, &cmd(&a), &mut out, 5_000);
        (String::from_utf8_lossy(&out).into_owned(), p.close)
    };
    assert_eq!(run(&mut a, &["CLIENT", "SETNAME", "alpha"]).0, "+OK\r\n");
    assert_eq!(
        run(&mut a, &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]).0,
        "+OK\r\n"
    );
    assert_eq!(
        run(&mut a, &["CLIENT", "SETINFO", "lib-ver", "8.0.0"]).0,
        "+OK\r\n"
    );
    assert_eq!(
        run(&mut a, &["CLIENT", "SETINFO", "lib-ver", "8 0"]).0,
        "-ERR lib-ver cannot contain spaces, newlines or special characters.\r\n"
    );
    assert_eq!(
        run(&mut a, &["CLIENT", "SETINFO", "color", "x"]).0,
        "-ERR Unrecognized option 'color'\r\n"
    );
    let long = "n".repeat(crate::resp::RESP_CLIENT_NAME_BYTES_MAX + 1);
    for args in [
        &["CLIENT", "SETNAME", &long][..],
        &["CLIENT", "SETINFO", "LIB-NAME", &long],
    ] {
        assert_eq!(
            run(&mut a, args).0,
            "-ERR client names and library info are at most 1024 bytes\r\n"
        );
    }
    assert_eq!(run(&mut a, &["CLIENT", "NO-EVICT", "on"]).0, "+OK\r\n");
    for help in [
        &["CLIENT", "HELP"][..],
        &["CONFIG", "HELP"],
        &["COMMAND", "HELP"],
    ] {
        let text = run(&mut a, help).0;
        assert!(
            text.starts_with('*') && text.contains("+HELP\r\n"),
            "{text}"
        );
    }
    assert_eq!(run(&mut a, &["CLIENT", "NO-TOUCH", "off"]).0, "+OK\r\n");
    assert_eq!(
        run(&mut a, &["CLIENT", "NOPE"]).0,
        "-ERR unknown subcommand 'NOPE'. Try CLIENT HELP.\r\n"
    );
    assert_eq!(
        run(&mut a, &["CLIENT", "SETNAME"]).0,
        "-ERR wrong number of arguments for 'client|setname' command\r\n"
    );
    let (list, _) = run(&mut b, &["CLIENT", "LIST"]);
    let lines: Vec<&str> = list.lines().collect();
    // The bulk header, a line per client, and the bulk's CRLF.
    assert_eq!(lines.len(), 4, "{list:?}");
    assert!(
        lines[1].starts_with("id=1 addr= laddr= fd=0 name=alpha age=5 idle=0 flags=N db=0 "),
        "{list:?}"
    );
    assert!(lines[1].contains(" cmd=client "), "{list:?}");
    assert!(
        lines[1].ends_with(" resp=2 lib-name=redis-py lib-ver=8.0.0"),
        "{list:?}"
    );
    assert!(lines[2].starts_with("id=2 "), "{list:?}");
    let (one, _) = run(&mut b, &["CLIENT", "LIST", "ID", "2"]);
    assert_eq!(one.lines().count(), 3, "{one:?}");
    // SKIPME defaults to yes: B cannot kill itself by id unless it says so.
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "ID", "2"]),
        (":0\r\n".into(), false)
    );
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "ID", "1"]),
        (":1\r\n".into(), false)
    );
    assert!(a.killed());
    // A killed connection closes at its next turn without running anything.
    assert_eq!(run(&mut a, &["PING"]), (String::new(), true));
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "1.2.3.4:5"]).0,
        "-ERR No such client\r\n"
    );
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "ID", "x"]).0,
        "-ERR client-id should be greater than 0\r\n"
    );
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "USER", "bob"]).0,
        "-ERR No such user 'bob'\r\n"
    );
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "ID", "1", "SKIPME"]).0,
        "-ERR syntax error\r\n"
    );
    // Killing itself with SKIPME no: the reply, then the close.
    assert_eq!(
        run(&mut b, &["CLIENT", "KILL", "ID", "2", "SKIPME", "no"]),
        (":1\r\n".into(), true)
    );
    // A dropped connection leaves the registry.
    drop(a);
    assert_eq!(shared.clients.len(), 1);
    drop(b);
    assert!(shared.clients.is_empty());
}

#[test]
fn config_set_and_resetstat() {
    let mut c = Conn::new(1);
    assert_eq!(c.run(&["CONFIG", "SET", "timeout", "30"]), "+OK\r\n");
    assert_eq!(
        c.run(&["CONFIG", "GET", "timeout"]),
        "*2\r\n$7\r\ntimeout\r\n$2\r\n30\r\n"
    );
    assert_eq!(c.shared.idle_timeout_ms.load(Ordering::Relaxed), 30_000);
    c.expect_err(&["CONFIG", "SET", "timeout", "x"], "CONFIG SET failed (possibly related to argument 'timeout') - argument couldn't be parsed into an integer");
    c.expect_err(&["CONFIG", "SET", "maxclients", "5"], "CONFIG SET failed (possibly related to argument 'maxclients') - can't set immutable config");
    c.expect_err(&["CONFIG", "SET", "requirepass", "x"], "CONFIG SET failed (possibly related to argument 'requirepass') - can't set immutable config");
    c.expect_err(
        &["CONFIG", "SET", "x", "1"],
        "CONFIG SET failed (possibly related to argument 'x') - Unsupported CONFIG parameter: x",
    );
    // Nothing is applied when one pair fails.
    assert!(c
        .run(&["CONFIG", "SET", "timeout", "0", "x", "1"])
        .starts_with("-ERR CONFIG SET failed"));
    assert_eq!(c.shared.idle_timeout_ms.load(Ordering::Relaxed), 30_000);
    c.expect_err(
        &["CONFIG", "SET", "timeout"],
        "wrong number of arguments for 'config|set' command",
    );
    // Counters for INFO.
    c.run(&["SET", "k", "v"]);
    c.run(&["GET", "k"]);
    c.run(&["GET", "k"]);
    c.run(&["GET"]);
    c.run(&["INCR", "k"]);
    c.run(&["NOSUCH"]);
    let stats = c.run(&["INFO", "commandstats", "errorstats"]);
    assert!(stats.contains("cmdstat_get:calls=2,usec="), "{stats}");
    assert!(
        stats.contains(",rejected_calls=1,failed_calls=0\r\n"),
        "{stats}"
    );
    assert!(
        stats.contains("cmdstat_incr:calls=1,") && stats.contains("failed_calls=1\r\n"),
        "{stats}"
    );
    assert!(stats.contains("errorstat_ERR:count="), "{stats}");
    assert!(!stats.contains("# Server"), "{stats}");
    assert_eq!(c.run(&["CONFIG", "RESETSTAT"]), "+OK\r\n");
    let after = c.run(&["INFO", "commandstats", "stats"]);
    assert!(!after.contains("cmdstat_get"), "{after}");
    assert!(after.contains("keyspace_hits:0\r\n"), "{after}");
    assert!(after.contains("total_error_replies:0\r\n"), "{after}");
}

#[test]
fn info_sections_follow_redis() {
    let mut c = Conn::new(1);
    let default = c.run(&["INFO"]);
    for s in [
        "# Server",
        "# Clients",
        "# Memory",
        "# Persistence",
        "# Stats",
        "# Replication",
        "# CPU",
        "# Errorstats",
        "# Cluster",
        "# Keyspace",
    ] {
        assert!(default.contains(s), "{s} in {default}");
    }
    assert!(!default.contains("# Commandstats"));
    assert!(default.contains("role:master\r\nconnected_slaves:0\r\n"));
    assert!(default.contains("db0:keys=0,expires=0,avg_ttl=0\r\n"));
    assert!(default.contains("used_cpu_sys:") && default.contains("used_cpu_user:"));
    assert!(c.run(&["INFO", "all"]).contains("# Commandstats"));
    assert!(c.run(&["INFO", "everything"]).contains("# Modules"));
    let two = c.run(&["INFO", "SERVER", "replication"]);
    assert!(two.contains("# Server") && two.contains("# Replication"));
    assert!(!two.contains("# Clients"));
    assert!(c.run(&["INFO", "default"]).contains("# Keyspace"));
}

/// Regression: TIME was missing. Redis answers two bulk
/// strings, Unix seconds and microseconds, and lists it in COMMAND.
#[test]
fn time_answers_the_wall_clock_as_redis_does() {
    let mut c = Conn::new(1);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let r = c.run(&["TIME"]);
    let parts: Vec<&str> = r.split("\r\n").collect();
    assert_eq!((parts[0], parts.len()), ("*2", 6), "{r:?}");
    let secs: u64 = parts[2].parse().expect("seconds");
    let micros: u64 = parts[4].parse().expect("microseconds");
    assert_eq!(parts[1], format!("${}", parts[2].len()));
    assert_eq!(parts[3], format!("${}", parts[4].len()));
    assert!(secs >= before && secs <= before + 60, "{secs} vs {before}");
    assert!(micros < 1_000_000);
    c.expect_err(
        &["TIME", "x"],
        "wrong number of arguments for 'time' command",
    );
    // Byte for byte what redis-server 7 sends, tips included.
    assert_eq!(
        c.run(&["COMMAND", "INFO", "time"]),
        "*1\r\n*10\r\n$4\r\ntime\r\n:1\r\n*3\r\n+loading\r\n+stale\r\n+fast\r\n:0\r\n:0\r\n:0\r\n*1\r\n+@fast\r\n*1\r\n$23\r\nnondeterministic_output\r\n*0\r\n*0\r\n"
    );
    c.run(&["HELLO", "3"]);
    assert_eq!(
        c.run(&["COMMAND", "INFO", "time"]),
        "*1\r\n*10\r\n$4\r\ntime\r\n:1\r\n~3\r\n+loading\r\n+stale\r\n+fast\r\n:0\r\n:0\r\n:0\r\n~1\r\n+@fast\r\n~1\r\n$23\r\nnondeterministic_output\r\n~0\r\n~0\r\n"
    );
    assert!(c.run(&["COMMAND", "DOCS", "time"]).contains("server"));
}

/// Regression: with no password set, AUTH answered every form
/// with the "without any password" error; Redis 7 refuses more than two
/// arguments as a syntax error and lets its passwordless `default` user
/// in with any password.
#[test]
fn auth_without_a_password_answers_as_redis_7() {
    let mut c = Conn::new(1);
    c.expect_err(&["AUTH", "a", "b", "c"], "syntax error");
    c.expect_err(&["AUTH", "a"], "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?");
    assert_eq!(c.run(&["AUTH", "default", "anything"]), "+OK\r\n");
    assert_eq!(
        c.run(&["AUTH", "a", "b"]),
        "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    c.expect_err(&["AUTH"], "wrong number of arguments for 'auth' command");
    assert_eq!(c.run(&["PING"]), "+PONG\r\n");
}

/// Regression: LCS ... IDX replied with an array under RESP3,
/// where Redis replies with a map (the same flat array under RESP2).
#[test]
fn lcs_idx_is_a_map_under_resp3() {
    let mut c = Conn::new(1);
    c.run(&["SET", "key1", "ohmytext"]);
    c.run(&["SET", "key2", "mynewtext"]);
    let args = [
        "LCS",
        "key1",
        "key2",
        "IDX",
        "MINMATCHLEN",
        "4",
        "WITHMATCHLEN",
    ];
    let body = "$7\r\nmatches\r\n*1\r\n*3\r\n*2\r\n:4\r\n:7\r\n*2\r\n:5\r\n:8\r\n:4\r\n$3\r\nlen\r\n:6\r\n";
    assert_eq!(c.run(&args), format!("*4\r\n{body}"));
    c.run(&["HELLO", "3"]);
    // Byte for byte what redis-server 7 sends.
    assert_eq!(c.run(&args), format!("%2\r\n{body}"));
}

/// The name-value pairs of a RESP2 CONFIG GET reply.
fn config_pairs(reply: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = reply.split("\r\n").collect();
    let n: usize = lines[0][1..].parse().expect("array length");
    (0..n / 2)
        .map(|i| (lines[2 + 4 * i].to_string(), lines[4 + 4 * i].to_string()))
        .collect()
}

/// Regression: CONFIG GET * listed 8 parameters. It lists
/// every one clients read at start that FabricKV can answer truthfully,
/// with globs, several patterns, and exact names as Redis 7 takes them.
#[test]
fn config_get_lists_what_clients_read_as_redis_7() {
    let shared = shared_with(2, None).with_bind("127.0.0.1:7380");
    let mut c = Conn::with(shared);
    let all = config_pairs(&c.run(&["CONFIG", "GET", "*"]));
    let names: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
    for want in [
        "save",
        "appendonly",
        "databases",
        "maxmemory",
        "maxmemory-policy",
        "port",
        "bind",
        "maxclients",
        "timeout",
        "proto-max-bulk-len",
        "notify-keyspace-events",
        "cluster-enabled",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let value = |k: &str| all.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(value("bind").as_deref(), Some("127.0.0.1"));
    assert_eq!(value("port").as_deref(), Some("7380"));
    assert_eq!(value("maxmemory").as_deref(), Some("16777216"));
    assert_eq!(value("databases").as_deref(), Some("1"));
    assert_eq!(value("proto-max-bulk-len").as_deref(), Some("536870912"));
    assert!(
        !names.contains(&"requirepass"),
        "the password is never shown"
    );
    // Several patterns, overlapping: each parameter once.
    let some = config_pairs(&c.run(&["CONFIG", "GET", "port", "p*", "b?nd", "[st]ave"]));
    assert_eq!(
        some,
        [
            ("port".to_string(), "7380".to_string()),
            ("proto-max-bulk-len".to_string(), "536870912".to_string()),
            ("bind".to_string(), "127.0.0.1".to_string()),
            ("save".to_string(), String::new()),
        ]
    );
    // Globs ignore case; an exact name is answered as it was spelled.
    assert_eq!(
        c.run(&["CONFIG", "GET", "MAXMEM*"]),
        "*6\r\n$9\r\nmaxmemory\r\n$8\r\n16777216\r\n$16\r\nmaxmemory-policy\r\n$10\r\nnoeviction\r\n$17\r\nmaxmemory-clients\r\n$1\r\n0\r\n"
    );
    assert_eq!(
        c.run(&["CONFIG", "GET", "Save", "save"]),
        "*2\r\n$4\r\nSave\r\n$0\r\n\r\n"
    );
    c.run(&["HELLO", "3"]);
    assert_eq!(
        c.run(&["CONFIG", "GET", "appendonly"]),
        "%1\r\n$10\r\nappendonly\r\n$2\r\nno\r\n"
    );
    assert!(c.run(&["CONFIG", "SET", "bind", "0.0.0.0"]).starts_with(
        "-ERR CONFIG SET failed (possibly related to argument 'bind') - can't set immutable config"
    ));
}
