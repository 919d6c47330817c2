//! Partitions are not workers: a fixed partition count (`--partitions`),
//! a table giving each partition to a worker, and partitions moving
//! between workers while clients read and write, checked end to end on
//! every transport.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fabrickv_client::{Client, Kv};
use fabrickv_server::Mode;

use common::{stat, value_of, wait_for, TestServer, Transport};

/// Engine memory of these servers: 8 MiB per partition at 8 partitions.
const MEMORY_BYTES: u64 = 64 << 20;

/// Partitions of these servers.
const PARTITIONS: usize = 8;

/// How long a test may wait for the clients to reach a state.
const PATIENCE: Duration = Duration::from_secs(60);

fn server(t: Transport, workers: usize) -> TestServer {
    TestServer::start_with(t, workers, Mode::Store, MEMORY_BYTES, |c| {
        c.partitions = Some(PARTITIONS);
    })
}

fn key(i: usize) -> Vec<u8> {
    format!("part-{i}").into_bytes()
}

fn eight_partitions_over_two_workers_find_every_key(t: Transport) {
    const KEYS: usize = 2_000;
    let s = server(t, 2);
    let mut c = s.client();
    assert_eq!((c.info().workers, c.info().partitions), (2, 8));
    let table = c.partition_table().expect("table");
    assert_eq!(
        table.owners,
        vec![0, 1, 0, 1, 0, 1, 0, 1],
        "dealt round robin"
    );
    assert_eq!(table.epoch, 0);
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let values: Vec<Vec<u8>> = (0..KEYS).map(|i| value_of(i as u64, 1 + i % 90)).collect();
    let pairs: Vec<(&Vec<u8>, &Vec<u8>)> = keys.iter().zip(&values).collect();
    c.mput(&pairs, None).expect("mput");
    let got = c.mget(&keys).expect("mget");
    for (i, g) in got.into_iter().enumerate() {
        assert_eq!(g.as_ref(), Some(&values[i]), "key {i}");
    }
    assert_eq!(stat(&mut c, "items"), KEYS as u64);
    assert_eq!(stat(&mut c, "partitions_owned"), PARTITIONS as u64);
    assert_eq!(stat(&mut c, "misrouted"), 0);
    let table = c.partition_table().expect("table");
    for (p, ops) in table.ops.iter().enumerate() {
        assert!(*ops > 0, "partition {p} served some of {KEYS} keys");
    }
    assert_eq!(table.ops.iter().sum::<u64>(), 2 * KEYS as u64);
    s.shutdown();
}

fn a_key_maps_to_the_same_partition_whatever_the_workers(t: Transport) {
    const KEYS: usize = 500;
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let mut seen: Option<(Vec<u32>, Vec<u64>)> = None;
    for workers in [1, 2, 3] {
        let s = server(t, workers);
        let mut c = s.client();
        assert_eq!(c.info().partitions, PARTITIONS as u32);
        let by_client: Vec<u32> = keys.iter().map(|k| c.partition_of(k)).collect();
        let pairs: Vec<(&Vec<u8>, &[u8])> = keys.iter().map(|k| (k, &b"v"[..])).collect();
        c.mput(&pairs, None).expect("mput");
        // The server counts each PUT on the partition it placed the key in.
        let by_server = c.partition_table().expect("table").ops;
        let mut expect = vec![0u64; PARTITIONS];
        for &p in &by_client {
            expect[p as usize] += 1;
        }
        assert_eq!(
            by_server, expect,
            "{workers} workers: server and client agree"
        );
        match &seen {
            None => seen = Some((by_client, by_server)),
            Some((first, counts)) => {
                assert_eq!(&by_client, first, "{workers} workers: same partitions");
                assert_eq!(&by_server, counts, "{workers} workers: same placement");
            }
        }
        s.shutdown();
    }
}

/// One client thread's loop: PUT a fresh value to one of its keys, read it
/// back, and now and then read all of them, checking each against the
/// last write acknowledged. Stops when `stop` is set; returns the ops it
/// ran.
fn read_your_writes(
    c: &mut Client,
    th: usize,
    keys: usize,
    stop: &AtomicBool,
    progress: &AtomicU64,
) -> u64 {
    let key = |i: usize| format!("mv{th}-{i}").into_bytes();
    let mut last: Vec<Option<Vec<u8>>> = vec![None; keys];
    let mut ops = 0u64;
    let mut round = 0u64;
    while !stop.load(Ordering::Acquire) {
        round += 1;
        let i = (round as usize * 7) % keys;
        let v = value_of((th as u64) << 32 | round, 8 + (round as usize % 40));
        c.put(&key(i), &v).expect("put while partitions move");
        last[i] = Some(v);
        assert_eq!(
            c.get(&key(i)).expect("get while partitions move").as_ref(),
            last[i].as_ref(),
            "thread {th} key {i}: a read sees the last acknowledged write"
        );
        ops += 2;
        if round.is_multiple_of(16) {
            let all: Vec<Vec<u8>> = (0..keys).map(key).collect();
            let got = c.mget(&all).expect("mget while partitions move");
            assert_eq!(got, last, "thread {th}: every key as last written");
            ops += keys as u64;
        }
        progress.fetch_add(1, Ordering::Release);
    }
    ops
}

fn partitions_move_back_and_forth_under_load(t: Transport) {
    const THREADS: usize = 3;
    const KEYS: usize = 64;
    const MOVES: usize = 60;
    let s = server(t, 2);
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|th| {
            let mut c = s.client();
            let (stop, progress, start) = (stop.clone(), progress.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let ops = read_your_writes(&mut c, th, KEYS, &stop, &progress);
                (c, ops)
            })
        })
        .collect();
    let mut admin = s.client();
    start.wait();
    // Each move waits for the clients to get some work done under the
    // table before it, so moves interleave with requests in flight.
    let deadline = Instant::now() + PATIENCE;
    let mut epoch = 0;
    for m in 0..MOVES {
        let before = progress.load(Ordering::Acquire);
        wait_for("the clients to make progress", PATIENCE, || {
            progress.load(Ordering::Acquire) >= before + 3
        });
        let p = (m * 3) % PARTITIONS;
        let owner = admin.partition_table().expect("table").owners[p];
        let t = admin.move_partition(p as u32, 1 - owner).expect("move");
        assert_eq!(t.owners[p], 1 - owner);
        assert!(t.epoch > epoch, "every move bumps the epoch");
        epoch = t.epoch;
        assert!(Instant::now() < deadline, "moves took too long");
    }
    let misrouted_during = stat(&mut admin, "misrouted");
    // Let every client see a reply after the last move, so each refreshes.
    let seen = progress.load(Ordering::Acquire);
    wait_for("the clients to run past the last move", PATIENCE, || {
        progress.load(Ordering::Acquire) >= seen + 4 * THREADS as u64
    });
    stop.store(true, Ordering::Release);
    let mut clients = Vec::new();
    for th in threads {
        let (c, ops) = th.join().expect("client thread");
        assert!(ops > 0);
        clients.push(c);
    }
    assert!(
        misrouted_during > 0,
        "moves under load misroute some requests"
    );
    // A client learns of a move from the hint in a reply for a partition
    // it steered by its old table: one read of its keys brings the hints
    // for every partition it uses, and the next call refreshes the table.
    // From then on it steers to the new owners and nothing is misrouted.
    let keys_of = |th: usize| -> Vec<Vec<u8>> {
        (0..KEYS)
            .map(|i| format!("mv{th}-{i}").into_bytes())
            .collect()
    };
    for (th, c) in clients.iter_mut().enumerate() {
        c.mget(&keys_of(th)).expect("mget");
        c.mget(&keys_of(th)).expect("mget");
        assert!(!c.table_is_stale(), "thread {th} refreshed its table");
    }
    let settled = stat(&mut admin, "misrouted");
    for (th, c) in clients.iter_mut().enumerate() {
        assert!(
            c.table_refreshes() > 1,
            "thread {th} refreshed its table after a hint"
        );
        let keys = keys_of(th);
        for k in &keys {
            c.put(k, b"after").expect("put after the moves");
        }
        let got = c.mget(&keys).expect("mget");
        assert!(got.iter().all(|v| v.as_deref() == Some(&b"after"[..])));
    }
    assert_eq!(
        stat(&mut admin, "misrouted"),
        settled,
        "after a refresh the clients steer to the new owners"
    );
    let table = admin.partition_table().expect("table");
    assert_eq!(table.epoch, epoch);
    assert_eq!(
        table.misrouted.iter().sum::<u64>(),
        settled,
        "the per-partition counters add up to the workers'"
    );
    s.shutdown();
}

fn a_frame_over_more_partitions_than_it_locks_at_once(t: Transport) {
    // 32 partitions, so a frame of hundreds of keys spans more than
    // FRAME_LOCKS_MAX (8) and runs in groups.
    const KEYS: usize = 1_500;
    let s = TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.partitions = Some(32);
    });
    let mut c = s.client();
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let values: Vec<Vec<u8>> = (0..KEYS).map(|i| value_of(i as u64, 1 + i % 50)).collect();
    let pairs: Vec<(&Vec<u8>, &Vec<u8>)> = keys.iter().zip(&values).collect();
    c.mput(&pairs, None).expect("mput");
    let got = c.mget(&keys).expect("mget");
    for (i, g) in got.into_iter().enumerate() {
        assert_eq!(g.as_ref(), Some(&values[i]), "key {i}");
    }
    let table = c.partition_table().expect("table");
    assert_eq!(table.ops.iter().sum::<u64>(), 2 * KEYS as u64);
    assert_eq!(stat(&mut c, "misrouted"), 0);
    s.shutdown();
}

fn a_move_through_the_server_handle_reaches_a_client_by_the_hint(t: Transport) {
    let s = server(t, 2);
    let mut c = s.client();
    let k = key(7);
    let p = c.partition_of(&k);
    let old = c.worker_of(&k);
    c.put(&k, b"before").expect("put");
    // The Rust API a test or an embedding program moves partitions with.
    let epoch = s.partitions().move_partition(p, 1 - old).expect("move");
    assert_eq!(epoch, 1);
    assert_eq!(c.worker_of(&k), old, "the client has not heard yet");
    assert!(!c.table_is_stale());
    // Sent to the old owner, served there, and the reply hints.
    assert_eq!(c.get(&k).expect("get").as_deref(), Some(&b"before"[..]));
    assert!(c.table_is_stale());
    assert_eq!(stat(&mut c, "misrouted"), 1);
    // The next call fetches the table first, then goes to the new owner.
    c.put(&k, b"after").expect("put");
    assert_eq!((c.table_epoch(), c.worker_of(&k)), (1, 1 - old));
    assert_eq!(c.get(&k).expect("get").as_deref(), Some(&b"after"[..]));
    assert_eq!(stat(&mut c, "misrouted"), 1, "nothing misrouted since");
    let t = c.partition_table().expect("table");
    assert_eq!((t.misrouted[p as usize], t.ops[p as usize]), (1, 4));
    s.shutdown();
}

fn large_values_travel_whole_while_their_partition_moves(t: Transport) {
    // A large value goes in pieces that must all reach the connection that
    // holds the transfer: the client does not refresh its table between
    // them, and the old owner serves them under the partition's lock.
    const ROUNDS: u64 = 6;
    let s = TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| {
        c.partitions = Some(PARTITIONS);
        c.large_memory_bytes = Some(256 << 20);
    });
    let mut c = s.client();
    let k = key(3);
    let p = c.partition_of(&k);
    let stop = Arc::new(AtomicBool::new(false));
    let moves = Arc::new(AtomicU64::new(0));
    let parts = s.partitions().clone();
    let mover = {
        let (stop, moves) = (stop.clone(), moves.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let to = 1 - parts.owner(p as usize);
                parts.move_partition(p, to).expect("move");
                moves.fetch_add(1, Ordering::Release);
                // Paces the moves (a few per transfer); no assertion waits on it.
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    for round in 0..ROUNDS {
        let v = value_of(round, 3 << 20);
        c.put(&k, &v)
            .expect("a large put while its partition moves");
        let got = c.get(&k).expect("a large get while its partition moves");
        assert!(
            got.as_ref() == Some(&v),
            "round {round}: the value read whole"
        );
    }
    stop.store(true, Ordering::Release);
    mover.join().expect("mover");
    assert!(moves.load(Ordering::Acquire) > 0);
    s.shutdown();
}

fn moves_to_no_such_worker_or_partition_are_refused(t: Transport) {
    let s = server(t, 2);
    let mut c = s.client();
    let err = c.move_partition(0, 2).expect_err("worker 2 of 2");
    assert_eq!(err.code(), fabrickv_types::ErrorCode::NoSuchWorker);
    let err = c
        .move_partition(PARTITIONS as u32, 0)
        .expect_err("no partition 8");
    assert_eq!(err.code(), fabrickv_types::ErrorCode::Malformed);
    assert_eq!(
        c.partition_table().expect("table").epoch,
        0,
        "nothing moved"
    );
    s.shutdown();
}

transport_tests!(
    eight_partitions_over_two_workers_find_every_key,
    a_key_maps_to_the_same_partition_whatever_the_workers,
    partitions_move_back_and_forth_under_load,
    moves_to_no_such_worker_or_partition_are_refused,
    a_frame_over_more_partitions_than_it_locks_at_once,
    a_move_through_the_server_handle_reaches_a_client_by_the_hint,
    large_values_travel_whole_while_their_partition_moves,
);
