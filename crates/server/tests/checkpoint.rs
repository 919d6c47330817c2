//! Checkpoints through a real server: keys written over the native
//! protocol and RESP, a SAVE, a BGSAVE, then a new server started with
//! `--restore` (and one started on the checkpoint directory alone)
//! answers them all, on every transport.

#[macro_use]
mod common;

use std::time::Duration;

use common::{cache_client, value_of, wait_for, Resp, TestServer, Transport, MEMORY_BYTES};
use fabrickv_client::Kv;
use fabrickv_server::Mode;

fn server(t: Transport, edit: impl FnOnce(&mut fabrickv_server::ServerConfig)) -> TestServer {
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.resp = Some("127.0.0.1:0".into());
        edit(c);
    })
}

fn every_key_comes_back_after_a_restart(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let s = server(t, |c| c.checkpoint.dir = Some(root.clone()));
    let mut c = s.client();
    for i in 0..2_000u32 {
        c.put(format!("native:{i}").as_bytes(), &i.to_le_bytes())
            .expect("put");
    }
    let mut r = Resp::connect(&s);
    r.send(&[b"LASTSAVE"]);
    assert_eq!(r.line(), ":0", "no save yet");
    r.send(&[b"SET", b"resp:ttl", b"kept", b"EX", b"3600"]);
    assert_eq!(r.line(), "+OK");
    r.send(&[b"SAVE"]);
    assert_eq!(r.line(), "+OK");
    r.send(&[b"LASTSAVE"]);
    let first: u64 = r.line()[1..].parse().expect("integer");
    assert!(first > 0);
    // Written after the first save, kept by a BGSAVE.
    c.put(b"after", b"bgsave").expect("put");
    c.delete(b"native:7").expect("delete");
    r.send(&[b"BGSAVE"]);
    assert_eq!(r.line(), "+Background saving started");
    // A BGSAVE counts as running from before its reply.
    wait_for("the background save", Duration::from_secs(60), || {
        !s.handle().checkpoints().saving()
    });
    assert_eq!(std::fs::read_dir(&root).expect("root").count(), 2);
    assert!(s.handle().checkpoints().last_error().is_none());
    s.shutdown();

    // Started on the directory alone, the newest checkpoint loads.
    let b = server(t, |c| c.checkpoint.dir = Some(root.clone()));
    let mut c = b.client();
    for i in (0..2_000u32).filter(|&i| i != 7) {
        assert_eq!(
            c.get(format!("native:{i}").as_bytes()).expect("get"),
            Some(i.to_le_bytes().to_vec()),
            "native:{i}"
        );
    }
    assert_eq!(
        c.get(b"native:7").expect("get"),
        None,
        "deleted before the save"
    );
    assert_eq!(c.get(b"after").expect("get"), Some(b"bgsave".to_vec()));
    let mut r = Resp::connect(&b);
    r.send(&[b"TTL", b"resp:ttl"]);
    let ttl: i64 = r.line()[1..].parse().expect("integer");
    assert!(
        (3000..=3600).contains(&ttl),
        "the TTL survives as a time: {ttl}"
    );
    // A save asked for over the native protocol (`fabrickv checkpoint
    // save`), into a directory under the root, restored by name.
    c.put(b"native-save", b"yes").expect("put");
    let st = c
        .checkpoint_save(Some("by-client"), Duration::from_secs(120))
        .expect("checkpoint save");
    assert!(
        std::path::Path::new(&st.dir).starts_with(root.join("by-client")),
        "{}",
        st.dir
    );
    assert_eq!(st.error, None);
    b.shutdown();
    let d = server(t, |c| c.checkpoint.restore = Some(root.join("by-client")));
    let mut c = d.client();
    assert_eq!(c.get(b"native-save").expect("get"), Some(b"yes".to_vec()));
    assert_eq!(c.get(b"after").expect("get"), Some(b"bgsave".to_vec()));
    d.shutdown();
}

fn a_server_without_a_checkpoint_dir_refuses_save(t: Transport) {
    let s = server(t, |_| {});
    let mut r = Resp::connect(&s);
    r.send(&[b"SAVE"]);
    let line = r.line();
    assert!(line.starts_with("-ERR no checkpoint directory"), "{line}");
    r.send(&[b"BGSAVE"]);
    assert!(r.line().starts_with("-ERR no checkpoint directory"));
    let e = s
        .client()
        .checkpoint_save(None, Duration::from_secs(60))
        .expect_err("no checkpoint dir");
    assert_eq!(
        e.code(),
        fabrickv_types::ErrorCode::CheckpointRefused,
        "{e}"
    );
}

/// KV-cache blocks written through the cache client come back after a
/// restart when the server saves its cache (`--checkpoint-cache`).
fn cached_blocks_come_back_with_checkpoint_cache(t: Transport) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let s = server(t, |c| {
        c.checkpoint.dir = Some(root.clone());
        c.checkpoint.cache = true;
    });
    let mut cc = cache_client(&s, 4 << 20);
    for i in 0..64u64 {
        cc.put(
            format!("block:{i}").as_bytes(),
            &value_of(i, 64 << 10),
            None,
        )
        .expect("cache put");
    }
    let st = s
        .client()
        .checkpoint_save(None, Duration::from_secs(120))
        .expect("checkpoint save");
    drop(cc);
    s.shutdown();
    let r = server(t, |c| c.checkpoint.restore = Some(st.dir.clone().into()));
    let mut cc = cache_client(&r, 4 << 20);
    for i in 0..64u64 {
        assert_eq!(
            cc.get(format!("block:{i}").as_bytes()).expect("cache get"),
            Some(value_of(i, 64 << 10)),
            "block {i}"
        );
    }
    drop(cc);
    r.shutdown();
}

transport_tests!(
    every_key_comes_back_after_a_restart,
    cached_blocks_come_back_with_checkpoint_cache,
    a_server_without_a_checkpoint_dir_refuses_save,
);
