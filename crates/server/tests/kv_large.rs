//! Values over 1 MiB (up to 512 MiB) over the native kv protocol: the
//! client sends them as PUT_CHUNK pieces and reads them with GET_CHUNK,
//! every frame within `FRAME_BYTES_MAX`, over every transport; the same
//! keyspace as RESP's large values; the receiving bound and a client
//! leaving halfway.

#[macro_use]
mod common;

use std::time::Duration;

use common::{
    parse_reply, recv_n, request, stat, stat_per_worker, wait_for, Reply, Resp, TestServer,
    Transport, TIMEOUT,
};
use fabrickv_client::Kv;
use fabrickv_server::Mode;
use fabrickv_types::limits::{LARGE_VALUE_BYTES_MAX, VALUE_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::PutCondition;

const MIB: usize = 1 << 20;

fn server(t: Transport, resp: bool) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, 32 << 20, |c| {
        if resp {
            c.resp = Some("127.0.0.1:0".into());
        }
        c.large_memory_bytes = Some(1 << 30);
    })
}

/// A value of `len` bytes that names `seed` and each byte's position.
fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn large_values_round_trip(t: Transport) {
    let s = server(t, false);
    let mut c = s.client();
    for (i, len) in [VALUE_BYTES_MAX + 1, 16 * MIB, 100 * MIB]
        .into_iter()
        .enumerate()
    {
        let key = format!("big-{i}").into_bytes();
        let v = value(len, i as u8 + 1);
        c.put(&key, &v).expect("put");
        let got = c.get(&key).expect("get").expect("present");
        assert_eq!(got.len(), len);
        assert!(got == v, "value {i} ({len} bytes) differs");
    }
    // Overwrite a large value with a small one and back.
    c.put(b"big-0", b"small").expect("put");
    assert_eq!(
        c.get(b"big-0").expect("get").as_deref(),
        Some(&b"small"[..])
    );
    // mget mixes inline and large values.
    let got = c.mget(&[&b"big-0"[..], b"big-1", b"absent"]).expect("mget");
    assert_eq!(got[0].as_deref(), Some(&b"small"[..]));
    assert!(got[1].as_deref() == Some(&value(16 * MIB, 2)[..]));
    assert_eq!(got[2], None);
    // Conditions and the largest bound.
    assert!(!c
        .put_with(b"big-1", &value(2 * MIB, 9), None, PutCondition::IfAbsent)
        .expect("put NX"));
    let over = vec![0u8; LARGE_VALUE_BYTES_MAX + 1];
    let e = c.put(b"over", &over).expect_err("over 512 MiB");
    assert_eq!(e.code(), ErrorCode::ValueTooLarge);
    assert_eq!(stat(&mut c, "kv_large_receiving_bytes"), 0);
    s.shutdown();
}

/// Regression: a value whose last GET_CHUNK piece is short (3 MiB + 5
/// bytes) came back `NO_SUCH_TRANSFER`. The pieces in flight shared a
/// reply frame; the pieces between the first and the last were answered
/// `REPLY_FULL`, the short last one fitted and was read, which unpins the
/// value, so the pieces sent again found nothing. The client now reads
/// the last piece in a round of its own.
fn a_short_last_piece_does_not_unpin_the_rest(t: Transport) {
    let s = server(t, false);
    let mut c = s.client();
    for (i, len) in [3 * MIB + 5, 2 * MIB + 1, 5 * MIB - 1]
        .into_iter()
        .enumerate()
    {
        let key = format!("short-tail-{i}").into_bytes();
        let v = value(len, i as u8 + 40);
        c.put(&key, &v).expect("put");
        let got = c.get(&key).expect("get").expect("present");
        assert!(got == v, "value {i} ({len} bytes) differs");
    }
    // Two keys answered LARGE_VALUE on one connection in one batch: only
    // the later is still pinned, so the earlier is read again on its own.
    let keys: [&[u8]; 3] = [b"short-tail-0", b"short-tail-0", b"short-tail-1"];
    let got = c.mget(&keys).expect("mget");
    assert!(got[0].as_deref() == Some(&value(3 * MIB + 5, 40)[..]));
    assert!(got[1] == got[0]);
    assert!(got[2].as_deref() == Some(&value(2 * MIB + 1, 41)[..]));
    s.shutdown();
}

/// Regression: a native large GET read one piece per round trip. Its
/// GET_CHUNKs went several to a request frame, so every reply frame held
/// the first piece and answered the others `REPLY_FULL`, to be sent again
/// in the next round. Each piece now has a frame of its own, streamed, and
/// none is answered `REPLY_FULL`.
fn a_large_get_streams_its_pieces_without_reply_full(t: Transport) {
    let s = server(t, false);
    let mut c = s.client();
    let v = value(16 * MIB + 3, 7);
    c.put(b"streamed", &v).expect("put");
    let before: u64 = stat_per_worker(&mut c, "reply_full").iter().sum();
    let mut buf = fabrickv_client::MgetBuf::new();
    for _ in 0..2 {
        c.mget_into(&[b"streamed"], &mut buf).expect("get");
        assert!(buf.iter().next().flatten() == Some(&v[..]));
    }
    let after: u64 = stat_per_worker(&mut c, "reply_full").iter().sum();
    assert_eq!(after, before, "pieces answered REPLY_FULL");
    s.shutdown();
}

transport_tests!(
    large_values_round_trip,
    a_short_last_piece_does_not_unpin_the_rest,
    a_large_get_streams_its_pieces_without_reply_full
);

#[test]
fn resp_and_native_share_large_values() {
    let s = server(Transport::Tcp, true);
    let mut c = s.client();
    let mut r = Resp::connect_large(&s);
    let a = value(16 * MIB, 7);
    r.send(&[b"SET", b"from-resp", &a]);
    assert_eq!(r.line(), "+OK");
    assert!(c.get(b"from-resp").expect("get").as_deref() == Some(&a[..]));
    let b = value(3 * MIB + 5, 8);
    c.put(b"from-native", &b).expect("put");
    r.send(&[b"GET", b"from-native"]);
    assert!(r.bulk().expect("found") == b);
    s.shutdown();
}

/// Sends one request of one operation to `key`'s worker on `ep`; returns
/// that operation's result.
fn one(
    ep: &mut dyn fabrickv_transport::Endpoint,
    worker: u16,
    build: impl FnOnce(&mut fabrickv_wire::RequestBuilder<'_>),
) -> (ErrorCode, Vec<u8>) {
    let msg = request(1, worker, build);
    ep.post(&msg).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    let reply = recv_n(ep, 1).pop().expect("reply");
    match parse_reply(&reply).2 {
        Reply::Results(mut r) => r.pop().expect("one result"),
        Reply::Refused(code) => panic!("refused whole: {code:?}"),
    }
}

#[test]
fn chunks_out_of_order_or_stale_are_refused() {
    let s = server(Transport::Tcp, false);
    let mut c = s.client();
    let w = c.worker_of(b"k");
    let mut ep = s.endpoint(w);
    let total = (2 * MIB) as u64;
    let piece = vec![1u8; 1000];
    let put = |ep: &mut dyn fabrickv_transport::Endpoint, transfer, offset| {
        one(ep, w, |b| {
            b.put_chunk(
                b"k",
                transfer,
                total,
                offset,
                &piece,
                0,
                PutCondition::Always,
            );
        })
        .0
    };
    assert_eq!(put(&mut *ep, 5, 1000), ErrorCode::NoSuchTransfer);
    assert_eq!(put(&mut *ep, 5, 0), ErrorCode::Ok);
    assert_eq!(put(&mut *ep, 6, 1000), ErrorCode::NoSuchTransfer);
    assert_eq!(put(&mut *ep, 5, 3000), ErrorCode::ChunkOutOfOrder);
    // The transfer is gone after an out-of-order piece.
    assert_eq!(put(&mut *ep, 5, 1000), ErrorCode::NoSuchTransfer);
    assert_eq!(stat(&mut c, "kv_large_receiving_bytes"), 0);
    // A GET_CHUNK of no pinned value.
    let (code, _) = one(&mut *ep, w, |b| {
        b.get_chunk(b"k", 42, 0, 10);
    });
    assert_eq!(code, ErrorCode::NoSuchTransfer);
    s.shutdown();
}

#[test]
fn a_reader_keeps_the_value_of_its_get() {
    let s = server(Transport::Tcp, false);
    let mut c = s.client();
    let old = value(2 * MIB, 1);
    c.put(b"k", &old).expect("put");
    let w = c.worker_of(b"k");
    let mut ep = s.endpoint(w);
    let (code, head) = one(&mut *ep, w, |b| {
        b.get(b"k");
    });
    assert_eq!(code, ErrorCode::LargeValue);
    assert_eq!(&head[..8], &(old.len() as u64).to_le_bytes());
    let tag = u64::from_le_bytes(head[8..16].try_into().expect("tag"));
    // Replaced and then deleted under the reader.
    c.put(b"k", &value(2 * MIB, 2)).expect("put");
    assert!(c.delete(b"k").expect("delete"));
    let (code, piece) = one(&mut *ep, w, |b| {
        b.get_chunk(b"k", tag, 5, 1000);
    });
    assert_eq!(code, ErrorCode::Ok);
    assert_eq!(piece, &old[5..1005]);
    // Past the end.
    let (code, _) = one(&mut *ep, w, |b| {
        b.get_chunk(b"k", tag, (2 * MIB - 10) as u64, 11);
    });
    assert_eq!(code, ErrorCode::Malformed);
    s.shutdown();
}

#[test]
fn receiving_is_bounded_and_a_client_leaving_gives_its_share_back() {
    let s = server(Transport::Tcp, false);
    let mut c = s.client();
    let w = c.worker_of(b"k");
    let total = LARGE_VALUE_BYTES_MAX as u64;
    let start = |ep: &mut dyn fabrickv_transport::Endpoint| {
        one(ep, w, |b| {
            b.put_chunk(b"k", 1, total, 0, b"x", 0, PutCondition::Always);
        })
        .0
    };
    // Two maximal values fill the 1 GiB bound; a third is refused.
    let mut a = s.endpoint(w);
    let mut b = s.endpoint(w);
    let mut d = s.endpoint(w);
    assert_eq!(start(&mut *a), ErrorCode::Ok);
    assert_eq!(start(&mut *b), ErrorCode::Ok);
    assert_eq!(start(&mut *d), ErrorCode::ReceivingFull);
    assert_eq!(
        stat(&mut c, "kv_large_receiving_bytes"),
        2 * LARGE_VALUE_BYTES_MAX as u64
    );
    // Both leave mid-transfer: their buffers are freed once idle.
    drop(a);
    drop(b);
    wait_for(
        "the receiving bytes to be given back",
        Duration::from_secs(15),
        || stat(&mut c, "kv_large_receiving_bytes") == 0,
    );
    assert_eq!(start(&mut *d), ErrorCode::Ok);
    s.shutdown();
}
