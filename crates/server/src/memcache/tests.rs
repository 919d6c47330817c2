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
fn run(sh: &McShared, s: &mut McConnState, input: &str, now: u64) -> String {
    let mut out = Vec::new();
    let p = s.process(sh, input.as_bytes(), &mut out, now);
    assert_eq!(p.consumed, input.len(), "all of {input:?} consumed");
    String::from_utf8(out).expect("utf8")
}

/// The CAS unique of a `gets` reply's one VALUE line.
fn cas_of(gets: &str) -> u64 {
    gets.split_whitespace()
        .nth(4)
        .expect("cas")
        .parse()
        .expect("n")
}

/// On a replicating server, a connection's buffered replies are settled
/// (need not wait for a replication round) only while they answer
/// `get`/`gets` of keys with no write in flight: a store, a `gat`, a get
/// of a written key and any other command are not.
#[test]
fn only_gets_of_settled_keys_leave_replies_settled() {
    use crate::partitions::journaled;
    let (partitions, seqs) = journaled::two();
    let a = journaled::key_in(&partitions, 0, "k");
    let b = journaled::key_in(&partitions, 1, "k");
    let sh = McShared::new(partitions, Mode::Store, 8 << 20, 1);
    let mut s = McConnState::new();
    let mut settled = |input: &str| {
        s.replies_unsettled = false;
        run(&sh, &mut s, input, 1);
        !s.replies_unsettled
    };
    assert!(settled(&format!("get {a}\r\n")), "nothing written yet");
    assert!(!settled(&format!("set {a} 0 0 1\r\nv\r\n")), "a store");
    assert!(!settled(&format!("get {a}\r\n")), "its write is in flight");
    assert!(settled(&format!("gets {b}\r\n")), "another partition");
    assert!(
        !settled(&format!("get {b} {a}\r\n")),
        "one key with a write in flight"
    );
    assert!(!settled(&format!("gat 10 {b}\r\n")), "gat writes");
    assert!(!settled("version\r\n"), "not a get");
    for q in seqs.iter() {
        q.mark_replicated(q.get());
    }
    assert!(
        settled(&format!("get {a} {b}\r\n")),
        "every write replicated"
    );
}

#[test]
fn storage_and_retrieval() {
    let sh = shared();
    let mut s = McConnState::new();
    let r = |s: &mut McConnState, i: &str| run(&sh, s, i, 1);
    assert_eq!(r(&mut s, "set a 7 0 3\r\nabc\r\n"), "STORED\r\n");
    assert_eq!(r(&mut s, "get a b\r\n"), "VALUE a 7 3\r\nabc\r\nEND\r\n");
    let cas = cas_of(&r(&mut s, "gets a\r\n"));
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
    let cas = cas_of(&r(&mut s, "gets a\r\n"));
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
    let mut s = McConnState::new();
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
    let mut s = McConnState::new();
    let r = |s: &mut McConnState, i: &str| run(&sh, s, i, 1);
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
    let mut s = McConnState::new();
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
    let mut s = McConnState::new();
    let r = |s: &mut McConnState, i: &str| run(&sh, s, i, 1);
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
    let mut s = McConnState::new();
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
    let mut s = McConnState::new();
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
    let mut s = McConnState::new();
    assert_eq!(run(&sh, &mut s, "get b\r\n", 1), "END\r\n");
    // A pipelined batch over both partitions answers as one command at a
    // time would.
    let mut s = McConnState::new();
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

/// Feeds `input` as the socket loop does, at most `chunk` more bytes per
/// read, keeping what a call left unconsumed; returns the replies and the
/// most bytes ever held unconsumed.
fn feed(sh: &McShared, s: &mut McConnState, input: &[u8], chunk: usize) -> (Vec<u8>, usize) {
    let mut replies = Vec::new();
    let mut held: Vec<u8> = Vec::new();
    let mut pos = 0;
    let mut most = 0;
    while pos < input.len() {
        let k = chunk.min(input.len() - pos);
        held.extend_from_slice(&input[pos..pos + k]);
        pos += k;
        most = most.max(held.len());
        loop {
            let mut out = Vec::new();
            let p = s.process(sh, &held, &mut out, 1);
            assert!(
                out.len() <= MC_OUTPUT_SOFT_BYTES + (64 << 10),
                "one call buffered {} reply bytes",
                out.len()
            );
            replies.extend_from_slice(&out);
            held.drain(..p.consumed);
            assert!(!p.close, "closed: {:?}", String::from_utf8_lossy(&out));
            if p.consumed == 0 || held.len() < p.need.max(1) {
                break;
            }
        }
    }
    assert!(held.is_empty(), "{} bytes left unconsumed", held.len());
    (replies, most)
}

#[test]
fn oversized_set_deletes_the_old_value_as_memcached_does() {
    let sh = shared();
    let mut s = McConnState::new();
    let too = fabrickv_memcache::MC_VALUE_BYTES_MAX + 1;
    let data = "x".repeat(too + 2);
    let big = |cmd: &str| format!("{cmd}\r\n{data}");
    assert_eq!(run(&sh, &mut s, "set k 0 0 1\r\na\r\n", 1), "STORED\r\n");
    assert_eq!(
        run(&sh, &mut s, &big(&format!("set k 0 0 {too}")), 1),
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(
        run(&sh, &mut s, "get k\r\n", 1),
        "END\r\n",
        "set removes it"
    );
    // noreply silences the refusal; the old value goes all the same.
    run(&sh, &mut s, "set k 0 0 1\r\na\r\n", 1);
    assert_eq!(
        run(&sh, &mut s, &big(&format!("set k 0 0 {too} noreply")), 1),
        ""
    );
    assert_eq!(run(&sh, &mut s, "get k\r\n", 1), "END\r\n");
    // add, append and cas leave it, as in memcached.
    run(&sh, &mut s, "set k 0 0 1\r\na\r\n", 1);
    for cmd in [
        format!("add k 0 0 {too}"),
        format!("append k 0 0 {too}"),
        format!("cas k 0 0 {too} 1"),
    ] {
        assert_eq!(
            run(&sh, &mut s, &format!("{}get k\r\n", big(&cmd)), 1),
            "SERVER_ERROR object too large for cache\r\nVALUE k 0 1\r\na\r\nEND\r\n",
            "{cmd}"
        );
    }
    // ms removes it whatever its mode (base64 keys decoded first).
    for cmd in [
        format!("ms k {too}"),
        format!("ms k {too} MA q"),
        format!("ms aw== {too} b ME"),
    ] {
        run(&sh, &mut s, "set k 0 0 1\r\na\r\n", 1);
        assert_eq!(
            run(&sh, &mut s, &format!("{}get k\r\n", big(&cmd)), 1),
            "SERVER_ERROR object too large for cache\r\nEND\r\n",
            "{cmd}"
        );
    }
}

#[test]
fn a_length_memcached_cannot_read_is_a_bad_line_and_the_next_line_is_read() {
    let sh = shared();
    let mut s = McConnState::new();
    run(&sh, &mut s, "set k 0 0 1\r\na\r\n", 1);
    // memcached reads the length as a 32-bit int and needs room for the
    // CRLF: past 2^31 - 3 the line is bad and nothing is swallowed.
    for len in ["4294967295", "2147483646", "99999999999999999999"] {
        assert_eq!(
            run(&sh, &mut s, &format!("set k 0 0 {len}\r\nget k\r\n"), 1),
            "CLIENT_ERROR bad command line format\r\nVALUE k 0 1\r\na\r\nEND\r\n",
            "{len}"
        );
        assert_eq!(
            run(&sh, &mut s, &format!("ms k {len}\r\nget k\r\n"), 1),
            "CLIENT_ERROR bad command line format\r\nVALUE k 0 1\r\na\r\nEND\r\n",
            "ms {len}"
        );
        assert_eq!(
            run(
                &sh,
                &mut s,
                &format!("set k 0 0 {len} noreply\r\nmn\r\n"),
                1
            ),
            "MN\r\n",
            "noreply {len}"
        );
    }
    // Within it, the data is swallowed as it arrives, never buffered.
    let mut out = Vec::new();
    let input = b"set k 0 0 2147483645\r\nget k\r\n";
    let p = s.process(&sh, input, &mut out, 1);
    assert_eq!(p.consumed, input.len(), "the get is taken as data");
    assert_eq!(out, b"SERVER_ERROR object too large for cache\r\n");
}

#[test]
fn noreply_silences_error_replies_too() {
    let sh = shared();
    let mut s = McConnState::new();
    run(&sh, &mut s, "set n 0 0 1\r\nx\r\n", 1);
    for cmd in [
        "delete k 10 noreply\r\n",
        "delete k a noreply\r\n",
        &format!("delete {} noreply\r\n", "k".repeat(251)),
        "incr k abc noreply\r\n",
        "incr n 1 noreply\r\n",
        &format!("incr {} 1 noreply\r\n", "k".repeat(251)),
        "touch k abc noreply\r\n",
        "flush_all invalid noreply\r\n",
        "verbosity x noreply\r\n",
        "set k 0 0 1 noreply\r\nab\r",
        "set k abc 0 1 noreply\r\n",
        "cas k 0 0 1 x noreply\r\n",
        &format!("set {} 0 0 1 noreply\r\n", "k".repeat(251)),
    ] {
        assert_eq!(
            run(&sh, &mut s, &format!("{cmd}mn\r\n"), 1),
            "MN\r\n",
            "{cmd:?}"
        );
    }
    // A line with the wrong number of words is answered ERROR whatever
    // its last word, as in memcached.
    assert_eq!(
        run(&sh, &mut s, "delete k a b noreply\r\nfoo noreply\r\n", 1),
        "ERROR\r\nERROR\r\n"
    );
    // "delete noreply" deletes the key "noreply".
    assert_eq!(run(&sh, &mut s, "delete noreply\r\n", 1), "NOT_FOUND\r\n");
    // Extra words that are not noreply are ignored, as memcached does.
    assert_eq!(
        run(&sh, &mut s, "set k 0 0 1 x\r\na\r\ntouch k 1 x\r\nincr k 1 x\r\nverbosity 1 y\r\nflush_all 0 y\r\n", 1),
        "STORED\r\nTOUCHED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\nOK\r\nOK\r\n"
    );
}

#[test]
fn error_texts_are_memcacheds() {
    let sh = shared();
    let mut s = McConnState::new();
    let r = |s: &mut McConnState, i: &str| run(&sh, s, i, 1_000);
    let usage = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
    assert_eq!(r(&mut s, "delete k 10\r\n"), usage);
    assert_eq!(r(&mut s, "delete k 0 x\r\n"), usage);
    assert_eq!(r(&mut s, "delete k 0\r\n"), "NOT_FOUND\r\n");
    assert_eq!(
        r(&mut s, "flush_all invalid\r\nflush_all noreply x\r\n"),
        "CLIENT_ERROR invalid exptime argument\r\n".repeat(2)
    );
    assert_eq!(r(&mut s, "flush_all 1 2 3\r\n"), "ERROR\r\n");
    assert_eq!(
        r(&mut s, "gat abc k\r\ngat 10\r\n"),
        "CLIENT_ERROR invalid exptime argument\r\nEND\r\n"
    );
    assert_eq!(
        r(&mut s, &format!("touch {} abc\r\n", "k".repeat(251))),
        "CLIENT_ERROR bad command line format\r\n"
    );
    // ms reports the CAS it did not store as c0, and echoes k and O.
    assert_eq!(r(&mut s, "ms c 1\r\na\r\n"), "HD\r\n");
    assert_eq!(
        r(&mut s, "ms c 1 C999999 c k O12\r\nb\r\n"),
        "EX c0 kc O12\r\n"
    );
    assert_eq!(r(&mut s, "ms none 1 C1 c\r\nb\r\n"), "NF c0\r\n");
    assert_eq!(r(&mut s, "ms c 1 ME c\r\nb\r\n"), "NS c0\r\n");
    // mg and ma report t as it stands where t is in the request: before
    // a T that follows it, after one that precedes it.
    assert_eq!(r(&mut s, "set t 0 100 1\r\n1\r\n"), "STORED\r\n");
    assert_eq!(
        r(
            &mut s,
            "mg t t T300\r\nmg t t\r\nmg t T400 t\r\nmg t v t T0\r\nmg t t\r\n"
        ),
        "HD t100\r\nHD t300\r\nHD t400\r\nVA 1 t400\r\n1\r\nHD t-1\r\n"
    );
    assert_eq!(
        r(&mut s, "set t 0 100 1\r\n1\r\nma t t T300\r\nma t t\r\n"),
        "STORED\r\nHD t100\r\nHD t300\r\n"
    );
    // stats cachedump answers an empty list, after memcached's checks of
    // its arguments; other groups take extra words, unknown ones ERROR.
    assert_eq!(r(&mut s, "stats cachedump 1 1\r\n"), "END\r\n");
    assert_eq!(r(&mut s, "stats cachedump 1 0 9\r\n"), "END\r\n");
    assert_eq!(
        r(&mut s, "stats cachedump\r\nstats cachedump 1\r\n"),
        "CLIENT_ERROR bad command line\r\n".repeat(2)
    );
    assert_eq!(
        r(&mut s, "stats cachedump x 1\r\n"),
        "CLIENT_ERROR bad command line format\r\n"
    );
    assert_eq!(
        r(&mut s, "stats cachedump 64 1\r\n"),
        "CLIENT_ERROR Illegal slab id\r\n"
    );
    assert_eq!(
        r(&mut s, "stats items x\r\nstats foo\r\n"),
        "END\r\nERROR\r\n"
    );
}

#[test]
fn an_http_request_line_closes_the_connection_without_a_reply() {
    let sh = shared();
    for line in [
        "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /x HTTP/1.0\r\n",
        "HTTP/1.1\r\n",
        "mn\r\nGET / HTTP/1.1\r\n",
    ] {
        let mut s = McConnState::new();
        let mut out = Vec::new();
        let p = s.process(&sh, line.as_bytes(), &mut out, 1);
        assert!(p.close, "{line:?}");
        let want: &[u8] = if line.starts_with("mn") {
            b"MN\r\n"
        } else {
            b""
        };
        assert_eq!(out, want, "{line:?}");
    }
    // A known command whose last word looks like HTTP is not one.
    let mut s = McConnState::new();
    assert_eq!(
        run(
            &sh,
            &mut s,
            "get / HTTP/1.1\r\nset k HTTP/1.1\r\nGET k\r\n",
            1
        ),
        "END\r\nERROR\r\nERROR\r\n"
    );
}

#[test]
fn a_get_line_past_the_piece_bound_is_streamed_and_answers_every_key() {
    let sh = shared();
    let mut s = McConnState::new();
    run(
        &sh,
        &mut s,
        "set key000001 0 0 1\r\na\r\nset key018724 0 0 2\r\nzz\r\n",
        1,
    );
    // The issue's line: 18,725 keys, 187 KB.
    let keys: Vec<String> = (0..18_725).map(|i| format!("key{i:06}")).collect();
    let line = format!("get {}\r\nmn\r\n", keys.join(" "));
    assert!(line.len() > 187_000);
    let (out, most) = feed(&sh, &mut s, line.as_bytes(), 16 << 10);
    assert_eq!(
        String::from_utf8(out).expect("utf8"),
        "VALUE key000001 0 1\r\na\r\nVALUE key018724 0 2\r\nzz\r\nEND\r\nMN\r\n"
    );
    assert!(
        most <= fabrickv_memcache::MC_KEYS_LINE_BYTES_MAX + (16 << 10),
        "held {most} bytes of the line"
    );
    // gets and gat stream the same way; so does a line that ends split
    // anywhere, and one whose replies are past the output bound.
    let value = "v".repeat(1000);
    for k in &keys[..2000] {
        run(&sh, &mut s, &format!("set {k} 0 0 1000\r\n{value}\r\n"), 1);
    }
    let line = format!(
        "gats 0 {}\r\n",
        format!("{} ", keys[..2000].join(" ")).repeat(10)
    );
    for chunk in [999, 16 << 10] {
        let (out, _) = feed(&sh, &mut s, line.as_bytes(), chunk);
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(text.matches("VALUE ").count(), 20_000, "chunk {chunk}");
        assert!(text.ends_with("END\r\n"));
        assert_eq!(text.matches("END\r\n").count(), 1);
    }
    let short = format!("gat 0 {}\r\n", keys[..50].join(" "));
    let (out, _) = feed(&sh, &mut s, short.as_bytes(), 1);
    let text = String::from_utf8(out).expect("utf8");
    assert_eq!(text.matches("VALUE ").count(), 50);
    assert!(text.ends_with("END\r\n"));
    // A key over 250 bytes, even far into a streamed line, is refused
    // once (memcached's words) and the rest of the line skipped.
    let bad = format!(
        "get {} {} key000001\r\nmn\r\n",
        keys.join(" "),
        "y".repeat(300)
    );
    let (out, _) = feed(&sh, &mut s, bad.as_bytes(), 16 << 10);
    let text = String::from_utf8(out).expect("utf8");
    assert!(
        text.ends_with("CLIENT_ERROR bad command line format\r\nMN\r\n"),
        "{}",
        &text[text.len().saturating_sub(200)..]
    );
    // Only spaces after get: ERROR, as in memcached.
    let spaces = format!("get {}\r\nmn\r\n", " ".repeat(100_000));
    let (out, _) = feed(&sh, &mut s, spaces.as_bytes(), 16 << 10);
    assert_eq!(out, b"ERROR\r\nMN\r\n");
}
