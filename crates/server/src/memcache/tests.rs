//! The memcache commands, sans-I/O: bytes in, replies out.

use std::sync::Arc;

use fabrickv_engine::{Partition, PartitionConfig};

use super::*;
use crate::config::Mode;
use crate::partitions::Partitions;

fn shared() -> McShared {
    let parts = (0..2)
        .map(|_| {
            Partition::new(&PartitionConfig {
                mode: fabrickv_engine::Mode::Store,
                pool_bytes: 4 << 20,
                index_buckets: None,
                memory: Default::default(),
            })
            .expect("partition")
        })
        .collect();
    McShared::new(Arc::new(Partitions::new(parts)), Mode::Store, 8 << 20, 1)
}

/// Runs `input` at `now`, returning the replies as text.
fn run(sh: &McShared, s: &mut McSession, input: &str, now: u64) -> String {
    let mut out = Vec::new();
    let p = s.process(sh, input.as_bytes(), &mut out, now);
    assert_eq!(p.consumed, input.len(), "all of {input:?} consumed");
    String::from_utf8(out).expect("utf8")
}

#[test]
fn storage_and_retrieval() {
    let sh = shared();
    let mut s = McSession::new();
    let r = |s: &mut McSession, i: &str| run(&sh, s, i, 1);
    assert_eq!(r(&mut s, "set a 7 0 3\r\nabc\r\n"), "STORED\r\n");
    assert_eq!(r(&mut s, "get a b\r\n"), "VALUE a 7 3\r\nabc\r\nEND\r\n");
    let gets = r(&mut s, "gets a\r\n");
    let cas: u64 = gets
        .split_whitespace()
        .nth(4)
        .expect("cas")
        .parse()
        .expect("n");
    assert_eq!(r(&mut s, "add a 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
    assert_eq!(r(&mut s, "replace b 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
    assert_eq!(r(&mut s, "append a 0 0 2\r\nde\r\n"), "STORED\r\n");
    assert_eq!(r(&mut s, "prepend a 0 0 1\r\n_\r\n"), "STORED\r\n");
    assert_eq!(r(&mut s, "get a\r\n"), "VALUE a 7 6\r\n_abcde\r\nEND\r\n");
    assert_eq!(
        r(&mut s, &format!("cas a 1 0 1 {cas}\r\nz\r\n")),
        "EXISTS\r\n",
        "the append changed the CAS"
    );
    assert_eq!(r(&mut s, "cas zz 1 0 1 5\r\nz\r\n"), "NOT_FOUND\r\n");
    let gets = r(&mut s, "gets a\r\n");
    let cas: u64 = gets
        .split_whitespace()
        .nth(4)
        .expect("cas")
        .parse()
        .expect("n");
    assert_eq!(
        r(&mut s, &format!("cas a 9 0 1 {cas}\r\nz\r\n")),
        "STORED\r\n"
    );
    assert_eq!(r(&mut s, "get a\r\n"), "VALUE a 9 1\r\nz\r\nEND\r\n");
    assert_eq!(r(&mut s, "set q 0 0 1 noreply\r\nq\r\n"), "");
    assert_eq!(
        r(&mut s, "delete q\r\ndelete q\r\n"),
        "DELETED\r\nNOT_FOUND\r\n"
    );
    assert_eq!(
        r(&mut s, "set k 0 0 2\r\nabc\r\n"),
        "CLIENT_ERROR bad data chunk\r\nERROR\r\n",
        "what follows the bad chunk is read as a line"
    );
    assert_eq!(r(&mut s, "bogus\r\n"), "ERROR\r\n");
    assert_eq!(r(&mut s, "set k 4294967295 0 0\r\n\r\n"), "STORED\r\n");
    assert_eq!(
        r(&mut s, "get k\r\n"),
        "VALUE k 4294967295 0\r\n\r\nEND\r\n"
    );
}

#[test]
fn expiry_follows_memcached() {
    let sh = shared();
    let mut s = McSession::new();
    assert_eq!(run(&sh, &mut s, "set t 0 10 1\r\nv\r\n", 1), "STORED\r\n");
    assert_eq!(
        run(&sh, &mut s, "get t\r\n", 10_000),
        "VALUE t 0 1\r\nv\r\nEND\r\n"
    );
    assert_eq!(run(&sh, &mut s, "get t\r\n", 10_002), "END\r\n");
    assert_eq!(run(&sh, &mut s, "set n 0 -1 1\r\nv\r\n", 1), "STORED\r\n");
    assert_eq!(run(&sh, &mut s, "get n\r\n", 1), "END\r\n");
    assert_eq!(run(&sh, &mut s, "set u 0 0 1\r\nv\r\n", 1), "STORED\r\n");
    assert_eq!(
        run(&sh, &mut s, "touch u 5\r\ntouch x 5\r\n", 1),
        "TOUCHED\r\nNOT_FOUND\r\n"
    );
    assert_eq!(
        run(&sh, &mut s, "gat 0 u\r\n", 2),
        "VALUE u 0 1\r\nv\r\nEND\r\n"
    );
    assert_eq!(
        run(&sh, &mut s, "get u\r\n", 100_000),
        "VALUE u 0 1\r\nv\r\nEND\r\n"
    );
    // An absolute unix time in the past is expired at once.
    assert_eq!(
        run(&sh, &mut s, "set p 0 2592001 1\r\nv\r\nget p\r\n", 1),
        "STORED\r\nEND\r\n"
    );
}

#[test]
fn incr_decr_wrap_and_refuse_non_numbers() {
    let sh = shared();
    let mut s = McSession::new();
    let r = |s: &mut McSession, i: &str| run(&sh, s, i, 1);
    assert_eq!(r(&mut s, "incr n 1\r\n"), "NOT_FOUND\r\n");
    assert_eq!(
        r(&mut s, "set n 3 0 20\r\n18446744073709551615\r\n"),
        "STORED\r\n"
    );
    assert_eq!(r(&mut s, "incr n 2\r\n"), "1\r\n");
    assert_eq!(r(&mut s, "decr n 5\r\n"), "0\r\n");
    assert_eq!(
        r(&mut s, "incr n 10\r\nget n\r\n"),
        "10\r\nVALUE n 3 2\r\n10\r\nEND\r\n"
    );
    assert_eq!(
        r(&mut s, "set x 0 0 1\r\na\r\nincr x 1\r\n"),
        "STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    );
    assert_eq!(
        r(&mut s, "incr n -1\r\n"),
        "CLIENT_ERROR invalid numeric delta argument\r\n"
    );
}

#[test]
fn flush_all_now_and_later() {
    let sh = shared();
    let mut s = McSession::new();
    assert_eq!(
        run(&sh, &mut s, "set a 0 0 1\r\n1\r\nflush_all\r\nget a\r\n", 1),
        "STORED\r\nOK\r\nEND\r\n"
    );
    assert_eq!(
        run(&sh, &mut s, "set a 0 0 1\r\n1\r\nget a\r\n", 1),
        "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n"
    );
    assert_eq!(
        run(&sh, &mut s, "flush_all 2\r\nget a\r\n", 1),
        "OK\r\nVALUE a 0 1\r\n1\r\nEND\r\n"
    );
    assert_eq!(run(&sh, &mut s, "get a\r\n", 3000), "END\r\n");
}

#[test]
fn meta_commands() {
    let sh = shared();
    let mut s = McSession::new();
    let r = |s: &mut McSession, i: &str| run(&sh, s, i, 1);
    assert_eq!(r(&mut s, "ms k 2 F5 T0\r\nhi\r\n"), "HD\r\n");
    assert_eq!(
        r(&mut s, "mg k v f s t k O9\r\n"),
        "VA 2 f5 s2 t-1 kk O9\r\nhi\r\n"
    );
    assert_eq!(r(&mut s, "mg k\r\n"), "HD\r\n");
    assert_eq!(
        r(&mut s, "mg nope v\r\nmg nope v q\r\nmn\r\n"),
        "EN\r\nMN\r\n"
    );
    let c = r(&mut s, "mg k c\r\n");
    let cas: u64 = c.trim_end()[4..].parse().expect("cas");
    assert_eq!(r(&mut s, "ms k 1 C999999\r\nx\r\n"), "EX\r\n");
    assert_eq!(
        r(&mut s, &format!("ms k 1 C{cas} q\r\nx\r\nmn\r\n")),
        "MN\r\n"
    );
    assert_eq!(
        r(&mut s, "ms k 1 MA\r\ny\r\nmg k v\r\n"),
        "HD\r\nVA 2\r\nxy\r\n"
    );
    assert_eq!(
        r(&mut s, "ms new 1 ME\r\ny\r\nms new 1 ME\r\ny\r\n"),
        "HD\r\nNS\r\n"
    );
    assert_eq!(r(&mut s, "ms none 1 MR\r\ny\r\n"), "NS\r\n");
    assert_eq!(
        r(&mut s, "md new\r\nmd new\r\nmd new q\r\nmn\r\n"),
        "HD\r\nNF\r\nMN\r\n"
    );
    assert_eq!(r(&mut s, "ma cnt\r\n"), "NF\r\n");
    assert_eq!(r(&mut s, "ma cnt N0 J10 v\r\n"), "VA 2\r\n10\r\n");
    assert_eq!(
        r(&mut s, "ma cnt D5 v\r\nma cnt MD D100 v\r\n"),
        "VA 2\r\n15\r\nVA 1\r\n0\r\n"
    );
    assert_eq!(r(&mut s, "mg k h\r\n"), "CLIENT_ERROR invalid flag\r\n");
    // E gives the written item the caller's CAS.
    assert_eq!(
        r(&mut s, "ms e 1 E777777\r\nx\r\nmg e c\r\n"),
        "HD\r\nHD c777777\r\n"
    );
    assert_eq!(r(&mut s, "ms e 1 C777777\r\ny\r\n"), "HD\r\n");
    // base64 keys: "Zm9v" is "foo".
    assert_eq!(
        r(&mut s, "ms Zm9v 1 b\r\nz\r\nget foo\r\n"),
        "HD\r\nVALUE foo 0 1\r\nz\r\nEND\r\n"
    );
    assert_eq!(r(&mut s, "mg Zm9v b k v\r\n"), "VA 1 b kZm9v\r\nz\r\n");
}

#[test]
fn too_large_values_are_swallowed_not_buffered() {
    let sh = shared();
    let mut s = McSession::new();
    let n = fabrickv_memcache::MC_VALUE_BYTES_MAX + 1;
    let head = format!("set big 0 0 {n}\r\n");
    let mut out = Vec::new();
    let p = s.process(&sh, head.as_bytes(), &mut out, 1);
    assert_eq!(p.consumed, head.len());
    assert_eq!(out, b"SERVER_ERROR object too large for cache\r\n");
    // The value arrives in pieces and is dropped as it comes.
    let chunk = vec![b'x'; 64 << 10];
    let mut left = n + 2;
    while left > 0 {
        let k = left.min(chunk.len());
        let p = s.process(&sh, &chunk[..k], &mut out, 1);
        assert_eq!(p.consumed, k);
        left -= k;
    }
    assert_eq!(run(&sh, &mut s, "get big\r\n", 1), "END\r\n");
}

#[test]
fn stats_use_memcached_names() {
    let sh = shared();
    let mut s = McSession::new();
    let st = run(&sh, &mut s, "set a 0 0 1\r\n1\r\nget a b\r\nstats\r\n", 1);
    for name in [
        "pid",
        "uptime",
        "time",
        "version",
        "curr_connections",
        "total_connections",
        "cmd_get 2",
        "cmd_set 1",
        "get_hits 1",
        "get_misses 1",
        "curr_items 1",
        "bytes 2",
        "limit_maxbytes",
        "threads 1",
        "evictions",
    ] {
        assert!(st.contains(&format!("STAT {name}")), "{name} in {st}");
    }
    assert!(st.ends_with("END\r\n"));
    assert_eq!(
        run(&sh, &mut s, "version\r\n", 1),
        format!("VERSION {MC_VERSION}\r\n")
    );
    assert_eq!(run(&sh, &mut s, "verbosity 1\r\n", 1), "OK\r\n");
    let mut out = Vec::new();
    assert!(s.process(&sh, b"quit\r\n", &mut out, 1).close);
}

#[test]
fn the_look_ahead_stops_at_a_partial_or_refused_command_and_changes_nothing() {
    let sh = shared();
    let batch = "get a\r\nset b 0 0 1\r\nx\r\n";
    // Two whole commands, then the start of a third.
    let input = format!("{batch}get c");
    assert_eq!(prefetch_ahead(&sh, input.as_bytes(), 0), batch.len());
    assert_eq!(
        prefetch_ahead(&sh, input.as_bytes(), batch.len()),
        batch.len()
    );
    // A refused store ends it: what follows may be its value, not commands.
    let refused = "set k 0 0 notanumber\r\n";
    let input = format!("get a\r\n{refused}get b\r\n");
    assert_eq!(
        prefetch_ahead(&sh, input.as_bytes(), 0),
        "get a\r\n".len() + refused.len()
    );
    // Looking ahead executes nothing: b was never stored.
    let mut s = McSession::new();
    assert_eq!(run(&sh, &mut s, "get b\r\n", 1), "END\r\n");
    // A pipelined batch over both partitions answers as one command at a
    // time would.
    let mut s = McSession::new();
    let sets: String = (0..20)
        .map(|i| format!("set k{i} 0 0 2\r\nv{}\r\n", i % 10))
        .collect();
    assert_eq!(run(&sh, &mut s, &sets, 1), "STORED\r\n".repeat(20));
    let gets: String = (0..20).map(|i| format!("get k{i}\r\n")).collect();
    let want: String = (0..20)
        .map(|i| format!("VALUE k{i} 0 2\r\nv{}\r\nEND\r\n", i % 10))
        .collect();
    assert_eq!(run(&sh, &mut s, &gets, 1), want);
}
