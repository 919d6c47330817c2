//! `mget_into`: a batched read that lands values in the caller's buffer
//! (`MgetBuf`), on one server and on a cluster, over every transport.
//! Values must land byte-exact whatever their size (absent keys, values
//! that share no reply frame, values over `VALUE_BYTES_MAX` read in
//! GET_CHUNK pieces), one buffer must serve calls of any size in turn,
//! and the result must be `mget`'s. (That no call allocates per key is
//! `mget_into_alloc.rs`'s, which needs a global allocator of its own.)

#[macro_use]
mod common;

use fabrickv_client::{Client, ClusterClient, ClusterOptions, Kv, MgetBuf};
use fabrickv_cluster::Cluster;
use fabrickv_server::Mode;
use fabrickv_types::limits::VALUE_BYTES_MAX;

use common::{value_of, TestServer, Transport, MEMORY_BYTES, TIMEOUT};

const MIB: usize = 1 << 20;

/// A server that takes values over `VALUE_BYTES_MAX` too.
fn server(t: Transport) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.large_memory_bytes = Some(64 << 20);
    })
}

/// Stores `n` keys named `prefix-i`, each with `len(i)` bytes, every third
/// one left absent; returns the keys and what each should read.
fn store(
    c: &mut impl Kv,
    prefix: &str,
    n: usize,
    len: impl Fn(usize) -> usize,
) -> (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>) {
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .collect();
    let want: Vec<Option<Vec<u8>>> = (0..n)
        .map(|i| (i % 3 != 1).then(|| value_of((n * 1000 + i) as u64, len(i))))
        .collect();
    for (k, v) in keys.iter().zip(&want) {
        match v {
            Some(v) => c.put(k, v).expect("put"),
            None => {
                c.delete(k).expect("delete");
            }
        }
    }
    (keys, want)
}

/// Asserts that `buf` holds exactly `want`, key by key.
fn assert_holds(buf: &MgetBuf, want: &[Option<Vec<u8>>], what: &str) {
    assert_eq!(buf.len(), want.len(), "{what}: key count");
    for (i, w) in want.iter().enumerate() {
        let got = buf.get(i);
        assert!(
            got == w.as_deref(),
            "{what}: key {i}: got {:?} bytes, want {:?}",
            got.map(<[u8]>::len),
            w.as_ref().map(Vec::len)
        );
    }
}

/// One buffer, calls of different sizes in turn: small values, values
/// too large to share a reply frame, a large (chunked) value among small
/// ones, none at all; each call's values and only those.
fn calls_of_any_size(c: &mut impl Kv, tag: &str) {
    let mut buf = MgetBuf::new();
    let (k1, w1) = store(c, &format!("{tag}-small"), 96, |i| i * 7 % 200);
    c.mget_into(&k1, &mut buf).expect("mget_into");
    assert_holds(&buf, &w1, "96 small");
    assert_eq!(c.mget(&k1).expect("mget"), w1, "mget reads the same");

    // 300 KiB each: a reply frame holds a few, the rest are sent again.
    let (k2, w2) = store(c, &format!("{tag}-wide"), 12, |i| (300 << 10) + i);
    c.mget_into(&k2, &mut buf).expect("mget_into");
    assert_holds(&buf, &w2, "12 wide");

    // A value over VALUE_BYTES_MAX (read in GET_CHUNK pieces) among small
    // ones and absent ones; the big one is asked for twice.
    let (mut k3, mut w3) = store(c, &format!("{tag}-mixed"), 9, |i| i + 1);
    let big = value_of(77, 3 * MIB + 5);
    assert!(big.len() > VALUE_BYTES_MAX);
    let big_key = format!("{tag}-big").into_bytes();
    c.put(&big_key, &big).expect("put big");
    k3.insert(4, big_key.clone());
    w3.insert(4, Some(big.clone()));
    k3.push(big_key);
    w3.push(Some(big));
    c.mget_into(&k3, &mut buf).expect("mget_into");
    assert_holds(&buf, &w3, "mixed with a large value");
    assert_eq!(c.mget(&k3).expect("mget"), w3, "mget reads the same");

    // Fewer keys and shorter values after longer ones: nothing stale.
    c.mget_into(&k1[..5], &mut buf).expect("mget_into");
    assert_holds(&buf, &w1[..5], "5 small after");
    let absent: Vec<Vec<u8>> = (0..4)
        .map(|i| format!("{tag}-no-{i}").into_bytes())
        .collect();
    c.mget_into(&absent, &mut buf).expect("mget_into");
    assert_holds(&buf, &[None, None, None, None], "absent only");
    let none: [&[u8]; 0] = [];
    c.mget_into(&none, &mut buf).expect("mget_into");
    assert!(buf.is_empty());
    // The first call's values again, in the same (grown) buffer.
    c.mget_into(&k1, &mut buf).expect("mget_into");
    assert_holds(&buf, &w1, "96 small again");
    let v: Vec<Option<Vec<u8>>> = buf.into_vecs();
    assert_eq!(v, w1);
}

fn one_server_lands_values_byte_exact(t: Transport) {
    let s = server(t);
    let mut c: Client = s.client();
    calls_of_any_size(&mut c, "one");
    s.shutdown();
}

fn a_cluster_lands_values_byte_exact(t: Transport) {
    let ss: Vec<TestServer> = (0..3).map(|_| server(t)).collect();
    let addrs: Vec<&str> = ss.iter().map(|s| s.addr.as_str()).collect();
    let cluster = Cluster::of_addrs("it", &addrs).expect("a valid cluster");
    let opts = ClusterOptions {
        transport: None,
        timeout: TIMEOUT,
        ..Default::default()
    };
    let mut c = ClusterClient::connect(&cluster, opts).expect("cluster client connects");
    calls_of_any_size(&mut c, "many");
    for s in ss {
        s.shutdown();
    }
}

fn a_bad_key_fails_the_call_as_mget_does(t: Transport) {
    let s = server(t);
    let mut c = s.client();
    let mut buf = MgetBuf::new();
    let keys: [&[u8]; 2] = [b"fine", b""];
    let e = c.mget_into(&keys, &mut buf).expect_err("an empty key");
    let m = c.mget(&keys).expect_err("an empty key");
    assert_eq!(e.code(), m.code());
    assert_eq!(e.to_string(), m.to_string());
    // The buffer serves the next call.
    c.put(b"fine", b"v").expect("put");
    c.mget_into(&[b"fine"], &mut buf).expect("mget_into");
    assert_eq!(buf.get(0), Some(&b"v"[..]));
    s.shutdown();
}

transport_tests!(
    one_server_lands_values_byte_exact,
    a_cluster_lands_values_byte_exact,
    a_bad_key_fails_the_call_as_mget_does,
);
