//! Acknowledged means durable: a real `fabrickv serve --shard` process is
//! killed with SIGKILL while clients write batches to it, restarted on the
//! same directory, and must hold every batch it acknowledged, value for
//! value; a batch it had not acknowledged is there whole or not at all.
//! Over tcp and over shm (both reach another process; inproc cannot).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use fabrickv_client::ShardClient;
use fabrickv_storage::gen::{GenSpec, GEN_KEY_BYTES_MIN};

mod common;

use common::serve;

/// Keys per written batch.
const BATCH_KEYS: usize = 8;

/// Acknowledged keys (over all writers) before the server is killed.
const ACKED_KEYS_BEFORE_KILL: usize = 400;

/// Writer threads, each on its own connection.
const WRITERS: u64 = 2;

/// How long a client call may wait: short, so that writers blocked on the
/// killed server give up quickly.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the writers may take to be acknowledged enough writes.
const ACK_WAIT: Duration = Duration::from_secs(30);

static NAMES: AtomicU32 = AtomicU32::new(0);

fn key_of(writer: u64, batch: u64, i: usize) -> Vec<u8> {
    format!("w{writer}-b{batch}-k{i}").into_bytes()
}

/// A value whose bytes and length (some inline, some in blob files: the
/// shard separates values from 128 bytes) depend on its key: value `i` of
/// `shard gen`'s generator, seeded by the writer and the batch.
fn value_of(writer: u64, batch: u64, i: usize) -> Vec<u8> {
    let len = if i.is_multiple_of(2) { 40 } else { 700 };
    let spec = GenSpec {
        pairs: BATCH_KEYS as u64,
        key_bytes: GEN_KEY_BYTES_MIN,
        value_bytes: len,
        seed: writer << 40 | batch,
    };
    let mut v = vec![0; len];
    spec.value(i as u64, &mut v);
    v
}

/// Keys acknowledged so far, and writers that have stopped.
type Progress = Arc<(Mutex<(usize, u64)>, Condvar)>;

/// What one writer did: the batches acknowledged, and the batch it was
/// writing when its call failed.
struct Written {
    writer: u64,
    acked: Vec<u64>,
    unacked: u64,
}

/// Writes batches until a call fails (the server was killed).
fn writer(addr: String, writer: u64, progress: Progress) -> Written {
    let (state, cv) = &*progress;
    // Wakes the test however this writer ends, so a failure is not a hang.
    struct Stopped<'a>(&'a Mutex<(usize, u64)>, &'a Condvar);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            if let Ok(mut s) = self.0.lock() {
                s.1 += 1;
            }
            self.1.notify_all();
        }
    }
    let _stopped = Stopped(state, cv);
    let mut c = ShardClient::connect(&addr, CALL_TIMEOUT).expect("writer connects");
    let mut acked = Vec::new();
    for batch in 0u64.. {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..BATCH_KEYS)
            .map(|i| (key_of(writer, batch, i), value_of(writer, batch, i)))
            .collect();
        if c.put_many("s", &pairs).is_err() {
            return Written {
                writer,
                acked,
                unacked: batch,
            };
        }
        acked.push(batch);
        state.lock().expect("progress lock").0 += BATCH_KEYS;
        cv.notify_all();
    }
    unreachable!("a writer stops only when the server is gone")
}

fn kill_during_writes_loses_no_acknowledged_write(listen: impl Fn() -> String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut served = serve(&listen(), dir.path(), 2);
    let progress: Progress = Arc::new((Mutex::new((0, 0)), Condvar::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (addr, p) = (served.addr.clone(), progress.clone());
            std::thread::spawn(move || writer(addr, w, p))
        })
        .collect();
    {
        let (state, cv) = &*progress;
        let (s, timeout) = cv
            .wait_timeout_while(state.lock().expect("progress lock"), ACK_WAIT, |s| {
                s.0 < ACKED_KEYS_BEFORE_KILL && s.1 == 0
            })
            .expect("progress lock");
        assert!(
            !timeout.timed_out() && s.1 == 0,
            "{} writes acknowledged and {} writers stopped before the kill",
            s.0,
            s.1
        );
    }
    // SIGKILL, with the writers still writing.
    served.child.kill().expect("kill -9 the server");
    served.child.wait().expect("reap the server");
    let written: Vec<Written> = writers
        .into_iter()
        .map(|t| t.join().expect("writer thread"))
        .collect();
    let total: usize = written.iter().map(|w| w.acked.len() * BATCH_KEYS).sum();
    assert!(total >= ACKED_KEYS_BEFORE_KILL, "{total} acknowledged");

    let served = serve(&listen(), dir.path(), 2);
    let mut c = ShardClient::connect(&served.addr, CALL_TIMEOUT).expect("connects after restart");
    let mut missing = BTreeMap::new();
    for w in &written {
        for &b in &w.acked {
            let keys: Vec<Vec<u8>> = (0..BATCH_KEYS).map(|i| key_of(w.writer, b, i)).collect();
            let got = c.get_many("s", &keys).expect("get_many after restart");
            for (i, g) in got.into_iter().enumerate() {
                if g != Some(value_of(w.writer, b, i)) {
                    missing.insert(String::from_utf8_lossy(&keys[i]).into_owned(), g.is_some());
                }
            }
        }
        // The batch in flight at the kill: atomic, so all or nothing.
        let keys: Vec<Vec<u8>> = (0..BATCH_KEYS)
            .map(|i| key_of(w.writer, w.unacked, i))
            .collect();
        let got = c.get_many("s", &keys).expect("get_many after restart");
        let present = got.iter().filter(|g| g.is_some()).count();
        assert!(
            present == 0 || present == BATCH_KEYS,
            "writer {}: unacknowledged batch {} is torn ({present} of {BATCH_KEYS} keys)",
            w.writer,
            w.unacked
        );
        for (i, g) in got.iter().enumerate() {
            if let Some(v) = g {
                assert_eq!(v, &value_of(w.writer, w.unacked, i), "torn value");
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {total} acknowledged writes lost or wrong after kill -9 (key -> present with a wrong value): {missing:?}",
        missing.len()
    );
}

#[test]
fn tcp_kill_during_writes_loses_no_acknowledged_write() {
    kill_during_writes_loses_no_acknowledged_write(|| "127.0.0.1:0".to_string());
}

#[test]
fn shm_kill_during_writes_loses_no_acknowledged_write() {
    fabrickv_transport_shm::install();
    kill_during_writes_loses_no_acknowledged_write(|| {
        format!(
            "shm://shard-crash-{}-{}",
            std::process::id(),
            NAMES.fetch_add(1, Ordering::Relaxed)
        )
    });
}
