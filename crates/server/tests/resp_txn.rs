//! Transactions and the keyspace commands over real sockets: MULTI/EXEC
//! pipelined as clients send them, WATCH aborted by a native-protocol
//! writer, an EXEC no concurrent MGET sees half of, and SCAN.

#[allow(unused_macros)]
mod common;

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Resp, TestServer, Transport, MEMORY_BYTES};
use fabrickv_client::Kv;
use fabrickv_server::Mode;

fn server() -> TestServer {
    TestServer::start_with(Transport::Tcp, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.resp = Some("127.0.0.1:0".into());
    })
}

#[test]
fn pipelined_transaction_and_watch_against_a_native_writer() {
    let s = server();
    let mut c = Resp::connect(&s);
    // As redis-py's pipeline sends it: everything in one write.
    for a in [
        &["MULTI"][..],
        &["SET", "a", "1"],
        &["INCRBY", "a", "41"],
        &["MGET", "a", "b"],
        &["EXEC"],
    ] {
        c.send_str(a);
    }
    assert_eq!(c.reply(), "+OK");
    for _ in 0..3 {
        assert_eq!(c.reply(), "+QUEUED");
    }
    assert_eq!(c.reply(), "[+OK,:42,[$42,nil]]");
    // A native write to a watched key aborts the transaction.
    let mut native = s.client();
    assert_eq!(c.call(&["WATCH", "a"]), "+OK");
    native.put(b"a", b"native").expect("put");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    assert_eq!(c.call(&["SET", "a", "resp"]), "+QUEUED");
    assert_eq!(c.call(&["EXEC"]), "nil");
    assert_eq!(c.call(&["GET", "a"]), "$native");
    // Untouched: it runs.
    assert_eq!(c.call(&["WATCH", "a"]), "+OK");
    assert_eq!(c.call(&["MULTI"]), "+OK");
    assert_eq!(c.call(&["SET", "a", "resp"]), "+QUEUED");
    assert_eq!(c.call(&["EXEC"]), "[+OK]");
    assert_eq!(native.get(b"a").expect("get"), Some(b"resp".to_vec()));
    s.shutdown();
}

#[test]
fn a_concurrent_mget_never_sees_half_an_exec() {
    let s = server();
    let keys: Vec<String> = (1..=50).map(|i| format!("a{i}")).collect();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut r = Resp::connect(&s);
            let mut mget = vec!["MGET"];
            mget.extend(keys.iter().map(String::as_str));
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) || reads < 50 {
                let got = r.call(&mget);
                let values: Vec<&str> = got
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .collect();
                assert_eq!(values.len(), 50);
                assert!(values.iter().all(|v| *v == values[0]), "torn: {got}");
                reads += 1;
            }
        });
        let mut w = Resp::connect(&s);
        for gen in 0..200 {
            let g = gen.to_string();
            w.send_str(&["MULTI"]);
            for k in &keys {
                w.send_str(&["SET", k, &g]);
            }
            w.send_str(&["EXEC"]);
            assert_eq!(w.reply(), "+OK");
            for _ in &keys {
                assert_eq!(w.reply(), "+QUEUED");
            }
            assert!(w.reply().starts_with("[+OK"));
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().expect("reader");
    });
    s.shutdown();
}

#[test]
fn scan_keys_rename_copy_over_a_socket() {
    let s = server();
    let mut c = Resp::connect(&s);
    for i in 0..300 {
        assert_eq!(c.call(&["SET", &format!("k{i}"), "v"]), "+OK");
    }
    let mut seen = std::collections::HashSet::new();
    let mut cursor = "0".to_string();
    loop {
        c.send_str(&["SCAN", &cursor, "COUNT", "25"]);
        let mut line = String::new();
        c.r.read_line(&mut line).expect("array");
        assert_eq!(line, "*2\r\n");
        cursor = c.reply().trim_start_matches('$').to_string();
        let keys = c.reply();
        for k in keys.trim_matches(|ch| ch == '[' || ch == ']').split(',') {
            if !k.is_empty() {
                seen.insert(k.trim_start_matches('$').to_string());
            }
        }
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), 300);
    assert_eq!(c.call(&["RENAME", "k1", "renamed"]), "+OK");
    assert_eq!(c.call(&["COPY", "renamed", "copied"]), ":1");
    assert_eq!(c.call(&["KEYS", "*ed"]).len(), "[$renamed,$copied]".len());
    assert_eq!(c.call(&["FLUSHDB"]), "+OK");
    assert_eq!(c.call(&["DBSIZE"]), ":0");
    s.shutdown();
}

/// An outside attack run (10 connections queueing 60 MiB each), scaled
/// down: connections queue big MULTI SETs past the server-wide `maxmemory-clients`; the one holding the most is
/// closed, the others keep their transactions, and the accounted bytes
/// stay under the cap.
#[test]
fn maxmemory_clients_closes_the_connection_holding_the_most() {
    let cap: u64 = 16 << 20;
    let s = TestServer::start_with(Transport::Tcp, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.resp = Some("127.0.0.1:0".into());
        c.maxmemory_clients_bytes = Some(cap);
    });
    let v = vec![b'x'; 200 << 10];
    // Three clients queue about 1 MiB each.
    let mut small: Vec<Resp> = (0..3).map(|_| Resp::connect(&s)).collect();
    for (n, c) in small.iter_mut().enumerate() {
        assert_eq!(c.call(&["MULTI"]), "+OK");
        for i in 0..5 {
            let key = format!("s{n}-{i}");
            assert_eq!(c.call_bytes(&[b"SET", key.as_bytes(), &v]), "+QUEUED");
        }
    }
    // A hog queues on, up to 40 MiB (under TXN_QUEUED_BYTES_MAX), until
    // the server closes it.
    let mut hog = Resp::connect(&s);
    assert_eq!(hog.call(&["MULTI"]), "+OK");
    let mut queued = 0;
    let closed = loop {
        if queued == 200 {
            break false;
        }
        let key = format!("hog{queued}");
        if hog
            .w
            .write_all(&common::encode(&[b"SET", key.as_bytes(), &v]))
            .is_err()
        {
            break true;
        }
        let mut line = Vec::new();
        match hog.r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break true,
            Ok(_) => assert_eq!(line, b"+QUEUED\r\n"),
        }
        queued += 1;
    };
    assert!(
        closed,
        "the hog queued {queued} SETs of 200 KiB and is still open"
    );
    // The others survive and run their transactions.
    for (n, c) in small.iter_mut().enumerate() {
        c.send_str(&["EXEC"]);
        assert_eq!(c.line(), "*5", "client {n}");
        for _ in 0..5 {
            assert_eq!(c.line(), "+OK");
        }
    }
    let mut o = Resp::connect(&s);
    assert_eq!(o.info_field("stats", "evicted_clients"), 1);
    assert_eq!(o.info_field("memory", "maxmemory_clients"), cap);
    assert_eq!(
        o.call(&["CONFIG", "GET", "maxmemory-clients"]),
        format!("[$maxmemory-clients,${cap}]")
    );
    assert!(o.info_field("memory", "mem_clients_normal") <= cap);
    assert_eq!(o.call(&["EXISTS", "hog0"]), ":0");
    s.shutdown();
}
