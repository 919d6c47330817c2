//! A worker with every service of the server registered, without
//! sockets: messages in, replies out, counters read back through STATS.

use std::sync::Arc;

use fabrickv_cache::CacheConfig;
use fabrickv_engine::{Mode as EngineMode, Partition, PartitionConfig, PoolOptions};
use fabrickv_wire::control::{
    decode_checkpoint_reply, decode_error, decode_hello_reply, decode_partitions_reply,
    decode_stats_reply, encode_checkpoint_request, encode_hello, encode_partitions_request,
    encode_stats_request, CheckpointRequest, CheckpointStatus, PartitionMove,
};
use fabrickv_wire::ps::encode_open;
use fabrickv_wire::{decode_frame, RequestBuilder};

use super::*;
use crate::cache::CacheShared;
use crate::config::Mode;
use crate::ps::{PsConfig, PsStore};
use crate::shard::Shards;

const NOW: u64 = 1;

/// Worker `id` of a server with two workers, with small pools.
fn server_worker(id: u16) -> Worker {
    server_worker_saving_to(id, None)
}

/// Worker `id`, its checkpoints saved under `root` if given.
fn server_worker_saving_to(id: u16, root: Option<std::path::PathBuf>) -> Worker {
    let parts = (0..2)
        .map(|_| {
            Partition::new(&PartitionConfig {
                mode: EngineMode::Store,
                pool_bytes: 4 << 20,
                index_buckets: None,
                memory: PoolOptions::default(),
            })
            .expect("partition")
        })
        .collect();
    let parts = Arc::new(Partitions::new(parts));
    let ps = Arc::new(PsStore::new(
        PsConfig {
            pool_bytes: 8 << 20,
            pool: PoolOptions::default(),
            tables: Vec::new(),
        },
        2,
    ));
    let cache = CacheShared::new(CacheConfig {
        pool_bytes: 8 << 20,
        ..CacheConfig::default()
    })
    .expect("cache store");
    let shards = Arc::new(Shards::open_for_tests(&[]));
    let checkpoints = Arc::new(Checkpoints::new(
        parts.clone(),
        ps.clone(),
        crate::replication::UnixClock::new(crate::service::Clock::new()),
        2,
        root,
        2,
    ));
    worker(
        id,
        Services {
            kv: KvService::new(id, 2, parts, Mode::Store),
            ps: PsService::new(id, ps),
            cache: CacheService::new(id, cache, None),
            shard: ShardService::new(id, shards),
            checkpoints,
        },
    )
    .expect("every service registers")
}

fn call(w: &mut Worker, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    w.handle(1, msg, &mut out, NOW);
    out
}

fn stats(w: &mut Worker) -> Vec<(String, u64)> {
    let mut req = Vec::new();
    encode_stats_request(&mut req, 9, 0);
    let out = call(w, &req);
    decode_stats_reply(&decode_frame(&out).expect("frame")).expect("stats reply")
}

fn stat(list: &[(String, u64)], name: &str) -> u64 {
    list.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {name} in STATS"))
}

fn refusal(out: &[u8]) -> (u64, ErrorCode) {
    let f = decode_frame(out).expect("frame");
    assert_eq!(f.header.kind, FrameKind::Error, "expected an ERROR frame");
    (f.header.request_id, decode_error(&f).expect("error body").0)
}

#[test]
fn hello_is_answered_with_the_server_shape() {
    let mut w = server_worker(1);
    let mut req = Vec::new();
    encode_hello(&mut req, 7, 1);
    let out = call(&mut w, &req);
    let f = decode_frame(&out).expect("frame");
    assert_eq!((f.header.request_id, f.header.worker), (7, 1));
    let info = decode_hello_reply(&f).expect("hello reply");
    assert_eq!((info.workers, info.partitions), (2, 2));
    assert!(info.store_mode);
}

fn checkpoint_call(w: &mut Worker, req: CheckpointRequest) -> Result<CheckpointStatus, ErrorCode> {
    let mut msg = Vec::new();
    encode_checkpoint_request(&mut msg, 21, 0, &req);
    let out = call(w, &msg);
    let f = decode_frame(&out).expect("frame");
    if f.header.kind == FrameKind::Error {
        return Err(decode_error(&f).expect("error body").0);
    }
    Ok(decode_checkpoint_reply(&f).expect("checkpoint reply"))
}

#[test]
fn checkpoint_saves_only_under_the_root_and_reports_how_it_went() {
    // Without a checkpoint directory nothing can be saved.
    let mut w = server_worker(0);
    let st = checkpoint_call(&mut w, CheckpointRequest::Status).expect("status");
    assert_eq!((st.finished, st.saving, st.last_ok_unix_s), (0, false, 0));
    assert_eq!(
        checkpoint_call(&mut w, CheckpointRequest::Save(String::new())),
        Err(ErrorCode::CheckpointRefused)
    );

    let root = tempfile::tempdir().expect("tempdir");
    let mut w = server_worker_saving_to(0, Some(root.path().to_path_buf()));
    for outside in ["/tmp", "../escape", "sub/../../escape"] {
        assert_eq!(
            checkpoint_call(&mut w, CheckpointRequest::Save(outside.into())),
            Err(ErrorCode::CheckpointRefused),
            "{outside}"
        );
    }
    let st = checkpoint_call(&mut w, CheckpointRequest::Save("nightly".into())).expect("started");
    // The save counts as running as soon as the reply says it started,
    // until `finished` moves past its value then.
    assert!(st.saving || st.finished == 1, "{st:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let done = loop {
        let now = checkpoint_call(&mut w, CheckpointRequest::Status).expect("status");
        if now.finished > 0 {
            break now;
        }
        assert!(std::time::Instant::now() < deadline, "save never finished");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(done.error, None);
    assert!(!done.saving && done.last_ok_unix_s > 0);
    let dir = std::path::Path::new(&done.dir);
    assert!(dir.starts_with(root.path().join("nightly")), "{}", done.dir);
    assert!(dir.join(crate::checkpoint::MANIFEST).is_file());
}

#[test]
fn every_refusal_is_one_error_frame_counted_once() {
    let mut w = server_worker(0);
    // Broken bytes: refused by the decoder, the request id read if present.
    let mut req = Vec::new();
    encode_hello(&mut req, 11, 0);
    req[0] ^= 0xFF;
    assert_eq!(refusal(&call(&mut w, &req)).0, 11);
    // A kind a client never sends.
    let mut req = Vec::new();
    let mut b = RequestBuilder::new(&mut req, 12, 0);
    b.get(b"k");
    b.finish();
    // The checksum covers the body only, so a changed kind byte still
    // decodes, and the frame is refused for its kind.
    req[3] = FrameKind::Response as u8;
    assert_eq!(refusal(&call(&mut w, &req)), (12, ErrorCode::UnknownOpcode));
    // A service's refusal (a PS table that does not exist).
    let mut req = Vec::new();
    encode_open(&mut req, 13, 0, "absent");
    assert_eq!(refusal(&call(&mut w, &req)), (13, ErrorCode::NoSuchTable));
    assert_eq!(stat(&stats(&mut w), "frames_refused"), 3);
}

#[test]
fn stats_list_each_service_in_registration_order_and_shared_stores_on_worker_0_only() {
    let mut w = server_worker(0);
    let mut req = Vec::new();
    let mut b = RequestBuilder::new(&mut req, 1, 0);
    b.get(b"k");
    b.finish();
    call(&mut w, &req);
    let list = stats(&mut w);
    let names: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names[..21],
        [
            "gets",
            "hits",
            "misses",
            "puts",
            "deletes",
            "evictions",
            "expired",
            "items",
            "bytes",
            "pool_bytes",
            "index_collisions",
            "slab_pages_moved",
            "slab_items_relocated",
            "slab_free_bytes",
            "frames",
            "ops",
            "misrouted",
            "reply_full",
            "wrong_server",
            "stale_map_writes",
            "partitions_owned",
        ]
    );
    // The worker's and the transport's counters follow, named by the rpc
    // crate (whose worker tests list them), up to `names[30]`.
    assert_eq!(names[21], "frames_refused");
    assert_eq!(
        names[30..34],
        [
            "kv_large_receiving_bytes",
            "partitions",
            "partitions_epoch",
            "partition_0_ops"
        ],
        "the native large values being received and the partition table \
         follow, on worker 0"
    );
    // Two partitions, two counters each.
    assert_eq!(names[37], "ps_tables", "the PS store follows, on worker 0");
    assert_eq!(
        stat(&list, "partition_0_ops") + stat(&list, "partition_1_ops"),
        1
    );
    assert!(names.contains(&"cache_entries"));
    assert_eq!(stat(&list, "frames"), 1);
    assert_eq!(stat(&list, "ops"), 1);
    let other = stats(&mut server_worker(1));
    assert_eq!(other.len(), 30, "worker 1 reports no shared store");
}

#[test]
fn partitions_frame_shows_and_moves_the_table() {
    let mut w = server_worker(1);
    let table = |w: &mut Worker, mv: Option<PartitionMove>| {
        let mut req = Vec::new();
        encode_partitions_request(&mut req, 4, 1, mv);
        let out = call(w, &req);
        decode_partitions_reply(&decode_frame(&out).expect("frame")).expect("table")
    };
    let t = table(&mut w, None);
    assert_eq!((t.epoch, t.workers, t.owners.clone()), (0, 2, vec![0, 1]));
    let mv = PartitionMove {
        partition: 0,
        worker: 1,
    };
    let t = table(&mut w, Some(mv));
    assert_eq!((t.epoch, t.owners), (1, vec![1, 1]));
    assert_eq!(stat(&stats(&mut w), "partitions_owned"), 2);
    let mut req = Vec::new();
    let bad = PartitionMove {
        partition: 0,
        worker: 2,
    };
    encode_partitions_request(&mut req, 5, 1, Some(bad));
    assert_eq!(refusal(&call(&mut w, &req)), (5, ErrorCode::NoSuchWorker));
}
