//! Persistent shards served over the native protocol, end to end: a real
//! server with `--shard` directories, the real [`ShardClient`], every test
//! run once per transport.

#[macro_use]
mod common;

use std::path::Path;

use fabrickv_client::{ClientError, ShardClient};
use fabrickv_server::shard::ShardSpec;
use fabrickv_server::Mode;
use fabrickv_types::ErrorCode;
use fabrickv_wire::decode_frame;
use fabrickv_wire::shard::decode_reply;
use fabrickv_wire::shard_data::{
    encode_delete, encode_put, SHARD_BATCH_KEYS_MAX, SHARD_DATA_KEY_BYTES_MAX,
    SHARD_DATA_VALUE_BYTES_MAX,
};

use common::{recv_n, value_of, TestServer, Transport, MEMORY_BYTES, TIMEOUT};

/// A server on `t` serving the shard `s` in `dir`.
fn server(t: Transport, dir: &Path) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.shards = vec![ShardSpec {
            name: "s".into(),
            path: dir.join("s"),
        }];
    })
}

fn client(s: &TestServer) -> ShardClient {
    ShardClient::connect(&s.addr, TIMEOUT).expect("shard client connects")
}

/// Regression: the shard a server creates for `--shard` and
/// a copy's target were group and world readable (0755 directories under
/// the usual umask). Asserts `path` is its owner's only: the directory
/// 0700 and no directory under it open to group or others.
fn assert_owner_only(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode, fabrickv_storage::SHARD_DIR_MODE, "{}", path.display());
    assert_eq!(
        fabrickv_storage::dirs_open_to_others(path).expect("walk"),
        Vec::<std::path::PathBuf>::new(),
        "{}",
        path.display()
    );
}

/// The code of a refused call.
fn code_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    r.expect_err("the call is refused").code()
}

fn put_get_delete_round_trip(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(t, dir.path());
    let mut c = client(&s);
    let pairs: Vec<(&[u8], Vec<u8>)> = vec![
        (b"", b"the empty key".to_vec()),
        (b"alpha", b"one".to_vec()),
        (b"\x00bin\xff", value_of(1, 300)),
        (b"empty value", Vec::new()),
    ];
    c.put_many("s", &pairs).expect("put_many");
    let keys: Vec<&[u8]> = pairs
        .iter()
        .map(|(k, _)| *k)
        .chain([&b"absent"[..]])
        .collect();
    let got = c.get_many("s", &keys).expect("get_many");
    for ((k, v), g) in pairs.iter().zip(&got) {
        assert_eq!(g.as_deref(), Some(&v[..]), "key {k:?}");
    }
    assert_eq!(got[pairs.len()], None, "a key never written");
    // A later batch overwrites, in order: the last value of a key wins.
    c.put_many("s", &[(&b"alpha"[..], &b"two"[..]), (b"alpha", b"three")])
        .expect("put_many");
    assert_eq!(
        c.get("s", b"alpha").expect("get").as_deref(),
        Some(&b"three"[..])
    );
    c.delete_many("s", &[&b""[..], b"alpha", b"never there"])
        .expect("delete_many");
    assert_eq!(
        c.get("s", b"").expect("get"),
        None,
        "the empty key is deleted"
    );
    assert_eq!(c.get("s", b"alpha").expect("get"), None);
    assert_eq!(
        c.get("s", b"empty value").expect("get").as_deref(),
        Some(&b""[..]),
        "an empty value is a value"
    );
    s.shutdown();
}

fn values_near_the_frame_bound_and_gets_over_several_replies(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(t, dir.path());
    let mut c = client(&s);
    let key = vec![b'k'; SHARD_DATA_KEY_BYTES_MAX];
    let big = value_of(2, SHARD_DATA_VALUE_BYTES_MAX);
    c.put("s", &key, &big)
        .expect("a maximal pair is one request");
    assert_eq!(c.get("s", &key).expect("get").as_deref(), Some(&big[..]));
    // Three values no single reply holds: the client asks again for those
    // that did not fit (REPLY_FULL) until every one is back.
    let third = SHARD_DATA_VALUE_BYTES_MAX / 2;
    let keys: Vec<Vec<u8>> = (0..3).map(|i| format!("half-{i}").into_bytes()).collect();
    for (i, k) in keys.iter().enumerate() {
        c.put("s", k, &value_of(10 + i as u64, third)).expect("put");
    }
    let got = c.get_many("s", &keys).expect("get_many");
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            g.as_deref(),
            Some(&value_of(10 + i as u64, third)[..]),
            "value {i}"
        );
    }
    // More keys than one request carries.
    let many: Vec<Vec<u8>> = (0..SHARD_BATCH_KEYS_MAX + 10)
        .map(|i| format!("many-{i}").into_bytes())
        .collect();
    let pairs: Vec<(&[u8], &[u8])> = many.iter().map(|k| (&k[..], &k[..])).collect();
    c.put_many("s", &pairs[..SHARD_BATCH_KEYS_MAX])
        .expect("a full batch");
    c.put_many("s", &pairs[SHARD_BATCH_KEYS_MAX..])
        .expect("the rest");
    let got = c.get_many("s", &many).expect("get_many over two requests");
    assert!(got
        .iter()
        .zip(&many)
        .all(|(g, k)| g.as_deref() == Some(&k[..])));
    // A write batch is one atomic request: too big is refused, not split.
    assert_eq!(code_of(c.put_many("s", &pairs)), ErrorCode::BatchTooLarge);
    let two_big = [(&b"a"[..], &big[..]), (b"b", &big[..])];
    assert_eq!(code_of(c.put_many("s", &two_big)), ErrorCode::FrameTooLarge);
    assert_eq!(c.get("s", b"a").expect("get"), None);
    s.shutdown();
}

fn unknown_shards_are_refused(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(t, dir.path());
    let mut c = client(&s);
    assert_eq!(code_of(c.put("nope", b"k", b"v")), ErrorCode::NoSuchShard);
    assert_eq!(code_of(c.get("nope", b"k")), ErrorCode::NoSuchShard);
    assert_eq!(code_of(c.delete("nope", b"k")), ErrorCode::NoSuchShard);
    match c.get("nope", b"k") {
        Err(ClientError::Server { message, .. }) => {
            assert!(
                message.contains("nope"),
                "the refusal names the shard: {message}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The connection is still good.
    c.put("s", b"k", b"v").expect("put");
    assert_eq!(c.get("s", b"k").expect("get").as_deref(), Some(&b"v"[..]));
    s.shutdown();
}

/// Sends a hand-built shard frame on worker 0 and returns the reply's code.
fn raw_code(s: &TestServer, frame: &[u8]) -> ErrorCode {
    let mut ep = s.endpoint(0);
    ep.post(frame).expect("post");
    ep.flush(TIMEOUT).expect("flush");
    let reply = recv_n(&mut *ep, 1).remove(0);
    let f = decode_frame(&reply).expect("a valid frame");
    decode_reply(&f).expect("a shard reply").0
}

fn an_oversized_key_is_refused_and_nothing_is_written(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(t, dir.path());
    let mut c = client(&s);
    let long = vec![b'x'; SHARD_DATA_KEY_BYTES_MAX + 1];
    // The client refuses before sending.
    let r = c.put_many("s", &[(&b"ok"[..], &b"v"[..]), (&long[..], b"v")]);
    assert!(
        matches!(r, Err(ClientError::Invalid(ErrorCode::KeyTooLong, _))),
        "{r:?}"
    );
    // The server refuses the same batch built by hand, whole.
    let mut frame = Vec::new();
    encode_put(
        &mut frame,
        1,
        0,
        "s",
        &[(&b"ok"[..], &b"v"[..]), (&long[..], b"v")],
    );
    assert_eq!(raw_code(&s, &frame), ErrorCode::KeyTooLong);
    assert_eq!(c.get("s", b"ok").expect("get"), None, "nothing was written");
    // A delete batch too.
    c.put("s", b"ok", b"v").expect("put");
    frame.clear();
    encode_delete(&mut frame, 2, 0, "s", &[&b"ok"[..], &long[..]]);
    assert_eq!(raw_code(&s, &frame), ErrorCode::KeyTooLong);
    assert_eq!(c.get("s", b"ok").expect("get").as_deref(), Some(&b"v"[..]));
    // A batch whose lengths disagree with its bytes.
    frame.clear();
    encode_put(&mut frame, 3, 0, "s", &[(&b"other"[..], &b"v"[..])]);
    let body = fabrickv_types::limits::FRAME_HEADER_BYTES + 8 + 1;
    // The pair's key length (after the 8-byte batch header) claims more.
    frame[body + 8] = 200;
    let crc = fabrickv_wire::checksum::crc32c(&frame[fabrickv_types::limits::FRAME_HEADER_BYTES..]);
    frame[20..24].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(raw_code(&s, &frame), ErrorCode::Malformed);
    assert_eq!(c.get("s", b"other").expect("get"), None);
    s.shutdown();
}

fn data_survives_a_restart(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..200u64)
        .map(|i| {
            (
                format!("key-{i}").into_bytes(),
                value_of(i, 100 + i as usize),
            )
        })
        .collect();
    {
        let s = server(t, dir.path());
        let mut c = client(&s);
        for chunk in pairs.chunks(50) {
            c.put_many("s", chunk).expect("put_many");
        }
        c.delete("s", b"key-7").expect("delete");
        c.put("s", b"", b"empty").expect("put");
        s.shutdown();
    }
    let s = server(t, dir.path());
    let mut c = client(&s);
    let keys: Vec<&[u8]> = pairs.iter().map(|(k, _)| &k[..]).collect();
    let got = c.get_many("s", &keys).expect("get_many");
    for ((k, v), g) in pairs.iter().zip(&got) {
        if k == b"key-7" {
            assert_eq!(g, &None, "the delete survived too");
        } else {
            assert_eq!(
                g.as_deref(),
                Some(&v[..]),
                "key {}",
                String::from_utf8_lossy(k)
            );
        }
    }
    assert_eq!(
        c.get("s", b"").expect("get").as_deref(),
        Some(&b"empty"[..])
    );
    s.shutdown();
}

/// Clients take the server's workers in turn (any worker serves any
/// shard), so several clients do not queue on one; a pair written through
/// one worker is read through every other.
fn clients_spread_over_the_workers_and_each_serves_the_shard(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(t, dir.path());
    let mut first = client(&s);
    first.put("s", b"k", b"v").expect("put");
    // A client can also be put on a worker of its choosing.
    let mut one = ShardClient::connect_worker(&s.addr, 1, TIMEOUT).expect("worker 1");
    assert_eq!(one.worker(), 1);
    assert_eq!(one.get("s", b"k").expect("get").as_deref(), Some(&b"v"[..]));
    common::assert_no_worker_2_of_2(ShardClient::connect_worker(&s.addr, 2, TIMEOUT));
    let mut seen = vec![first.worker()];
    // Tests running beside this one take turns too, so a new client's
    // worker is not known in advance; every worker turns up within a few.
    for _ in 0..64 {
        let mut c = client(&s);
        assert!(c.worker() < 2, "worker {} of 2", c.worker());
        if !seen.contains(&c.worker()) {
            seen.push(c.worker());
            assert_eq!(
                c.get("s", b"k").expect("get").as_deref(),
                Some(&b"v"[..]),
                "worker {} reads what worker {} wrote",
                c.worker(),
                first.worker()
            );
        }
        if seen.len() == 2 {
            return;
        }
    }
    panic!("64 clients all talked to worker {:?}", seen);
}

/// The copy's control over the native protocol: states, and the stable
/// codes of every misuse; then a whole copy driven by `fabrickv_copy`'s
/// target through this transport's control connection.
fn copy_control_states_and_refusals(t: Transport) {
    use fabrickv_wire::copy::{
        encode_run_id, CheckpointReply, CheckpointRequest, CopyState, StartRequest, Status,
    };
    use fabrickv_wire::shard::ShardOp;

    let dir = tempfile::tempdir().expect("tempdir");
    // A parent others may enter, as /srv or /var/lib are.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let s = server(t, dir.path());
    assert_owner_only(&dir.path().join("s"));
    let mut c = client(&s);
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..300u32)
        .map(|i| (format!("k{i:04}").into_bytes(), value_of(i.into(), 200)))
        .chain([(Vec::new(), b"the empty key".to_vec())])
        .collect();
    c.put_many("s", &pairs).expect("put_many");
    let checkpoint = |c: &mut ShardClient, shard: &str, ranges: u32| {
        let req = CheckpointRequest {
            ranges,
            boundaries: Vec::new(),
        };
        c.copy_control(ShardOp::CopyCheckpoint, shard, |b| req.encode(b))
    };
    let status = |c: &mut ShardClient, id: u64| {
        c.copy_control(ShardOp::CopyStatus, "", |b| encode_run_id(b, id))
            .map(|b| Status::decode(&b).expect("status decodes"))
    };
    assert_eq!(
        code_of(checkpoint(&mut c, "nope", 2)),
        ErrorCode::NoSuchShard
    );
    assert_eq!(code_of(checkpoint(&mut c, "s", 0)), ErrorCode::Malformed);
    assert_eq!(code_of(status(&mut c, 999)), ErrorCode::NoSuchCopy);
    let cp =
        CheckpointReply::decode(&checkpoint(&mut c, "s", 3).expect("checkpoint")).expect("reply");
    common::wait_for("the checkpoint's split", TIMEOUT, || {
        status(&mut c, cp.run_id).expect("status").ready
    });
    let st = status(&mut c, cp.run_id).expect("status");
    assert_eq!(
        (st.state, st.ranges),
        (CopyState::Idle, st.boundaries.len() as u32 + 1)
    );
    let start = |token| StartRequest {
        run_id: cp.run_id,
        token,
        streams: 1,
        resume: Vec::new(),
    };
    let bad = start(cp.token ^ 1);
    assert_eq!(
        code_of(c.copy_control(ShardOp::CopyStart, "", |b| bad.encode(b))),
        ErrorCode::Malformed,
        "a wrong token"
    );
    let good = start(cp.token);
    c.copy_control(ShardOp::CopyStart, "", |b| good.encode(b))
        .expect("start");
    assert_eq!(
        code_of(c.copy_control(ShardOp::CopyStart, "", |b| good.encode(b))),
        ErrorCode::CopyState,
        "START twice"
    );
    // No stream ever connects; END stops the run and forgets it.
    let ended = c
        .copy_control(ShardOp::CopyEnd, "", |b| encode_run_id(b, cp.run_id))
        .expect("end");
    let st = Status::decode(&ended).expect("status");
    assert!(
        matches!(st.state, CopyState::Stopped | CopyState::Error),
        "{st:?}"
    );
    assert_eq!(code_of(status(&mut c, cp.run_id)), ErrorCode::NoSuchCopy);

    // Whole copies with this transport as the control connection, with
    // the copy's pages dropped as it goes (the default) and kept.
    for keep_cached in [false, true] {
        let to = dir.path().join(format!("copy-{keep_cached}"));
        let mut opts = fabrickv_copy::CopyOptions::new(&s.addr, "s", &to);
        opts.ranges = 4;
        opts.keep_cached = keep_cached;
        let report = fabrickv_copy::copy(&opts, &mut |_| {}).expect("copy");
        assert!(report.verified);
        assert_eq!(report.pairs, pairs.len() as u64);
        assert_owner_only(&to);
        let copy = fabrickv_storage::FjallShard::open(&to, &Default::default()).expect("open copy");
        for (k, v) in &pairs {
            use fabrickv_storage::ShardBackend;
            assert_eq!(copy.get(k).expect("get").as_deref(), Some(&v[..]), "{k:?}");
        }
    }
}

transport_tests!(
    clients_spread_over_the_workers_and_each_serves_the_shard,
    copy_control_states_and_refusals,
    put_get_delete_round_trip,
    values_near_the_frame_bound_and_gets_over_several_replies,
    unknown_shards_are_refused,
    an_oversized_key_is_refused_and_nothing_is_written,
    data_survives_a_restart,
);
