//! Regression, "the client allocates per key": a warm `mget_into`
//! must allocate nothing per key. A counting global allocator (local to
//! this test binary) counts the allocations the calling thread makes
//! during one call; a 96-key call must make no more than an 8-key call
//! over the same workers, and only a handful in all (the batch's
//! operation list, its worker order, one position list per frame).
//! The server's threads allocate as they like: only the thread that asked
//! is counted.

// A global allocator is unsafe by definition; it only forwards to `System`.
#![allow(unsafe_code)]

#[macro_use]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use fabrickv_client::{Client, ClusterClient, ClusterOptions, Kv, MgetBuf};
use fabrickv_cluster::Cluster;

use common::{keys_of_worker, value_of, TestServer, Transport, TIMEOUT};

/// The system allocator, counting the allocations of threads that asked.
struct Counting;

thread_local! {
    /// Whether this thread's allocations are being counted.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// This thread's allocations (and reallocations) while counting.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: a thread being torn down has no locals left.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is passed to `System` unchanged; counting touches
// only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations this thread makes while running `f`.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCS.with(Cell::get)
}

/// Most allocations a warm call may make, whatever its key count.
const CALL_ALLOCS_MAX: u64 = 16;

fn a_warm_mget_into_allocates_nothing_per_key(t: Transport) {
    let s = TestServer::default_on(t);
    let mut c: Client = s.client();
    // Half the keys on each worker, so both calls post one frame to each.
    let mut keys = keys_of_worker(&c, 0, 48, "alloc");
    keys.extend(keys_of_worker(&c, 1, 48, "alloc"));
    let small: Vec<Vec<u8>> = [&keys[..4], &keys[48..52]].concat();
    for (i, k) in keys.iter().enumerate() {
        // Every fourth key absent; the others 0..=500 bytes.
        if i % 4 != 3 {
            c.put(k, &value_of(i as u64, i * 37 % 501)).expect("put");
        }
    }
    let mut buf = MgetBuf::new();
    let (many, few) = warm_allocations(&mut c, &keys, &small, &mut buf);
    for (i, k) in keys.iter().enumerate() {
        let want = (i % 4 != 3).then(|| value_of(i as u64, i * 37 % 501));
        assert_eq!(buf.get(i), want.as_deref(), "key {k:?}");
    }
    eprintln!("{t:?}: a warm mget_into took {many} allocations for 96 keys, {few} for 8");
    assert!(
        many <= few,
        "96 keys took {many} allocations, 8 keys {few}: some grow with the keys"
    );
    assert!(
        many <= CALL_ALLOCS_MAX,
        "a warm 96-key call took {many} allocations"
    );
    // The allocating API, for scale: at least one per value found.
    let old = allocations(|| {
        c.mget(&keys).expect("mget");
    });
    eprintln!("{t:?}: mget took {old} allocations for 96 keys");
    assert!(old >= 64, "mget took {old} allocations for 71 values");
    s.shutdown();
}

/// Warms `c` and `buf` with calls of `keys` and of `small` (the buffer,
/// the connections' queues and buffers grow to size), then counts the
/// allocations of five calls of each, taking each one's fewest: (for
/// `keys`, for `small`). `buf` is left holding `keys`' values.
fn warm_allocations(
    c: &mut impl Kv,
    keys: &[Vec<u8>],
    small: &[Vec<u8>],
    buf: &mut MgetBuf,
) -> (u64, u64) {
    let mut call = |keys: &[Vec<u8>], buf: &mut MgetBuf| {
        allocations(|| c.mget_into(keys, buf).expect("mget_into"))
    };
    for _ in 0..4 {
        call(keys, buf);
        call(small, buf);
    }
    let (mut many, mut few) = (u64::MAX, u64::MAX);
    for _ in 0..5 {
        many = many.min(call(keys, buf));
        few = few.min(call(small, buf));
    }
    call(keys, buf);
    (many, few)
}

/// Most allocations a warm call on a two-server cluster may make,
/// whatever its key count (the keys' hashes, the split by server, and
/// each server's part as on one server).
const CLUSTER_CALL_ALLOCS_MAX: u64 = 32;

fn a_warm_cluster_mget_into_allocates_nothing_per_key(t: Transport) {
    let ss = [TestServer::default_on(t), TestServer::default_on(t)];
    let cluster = Cluster::of_addrs("it", &[ss[0].addr.as_str(), ss[1].addr.as_str()])
        .expect("a valid cluster");
    let opts = ClusterOptions {
        transport: None,
        timeout: TIMEOUT,
        ..Default::default()
    };
    let mut c = ClusterClient::connect(&cluster, opts).expect("cluster client connects");
    // 24 keys for each (server, worker) pair, and 2 of them for the small
    // call: both calls post one frame to each worker of each server.
    let mut by_pair: [Vec<Vec<u8>>; 4] = Default::default();
    for i in 0u64.. {
        if by_pair.iter().all(|p| p.len() == 24) {
            break;
        }
        let k = format!("calloc-{i}").into_bytes();
        let s = c.server_of(&k);
        let w = c.server(s).expect("server").worker_of(&k);
        let p = &mut by_pair[(s * 2) as usize + usize::from(w)];
        if p.len() < 24 {
            p.push(k);
        }
    }
    let keys: Vec<Vec<u8>> = by_pair.concat();
    let small: Vec<Vec<u8>> = by_pair.iter().flat_map(|p| p[..2].to_vec()).collect();
    for (i, k) in keys.iter().enumerate() {
        c.put(k, &value_of(i as u64, i * 13 % 300)).expect("put");
    }
    let mut buf = MgetBuf::new();
    let (many, few) = warm_allocations(&mut c, &keys, &small, &mut buf);
    for (i, _) in keys.iter().enumerate() {
        assert_eq!(buf.get(i), Some(&value_of(i as u64, i * 13 % 300)[..]));
    }
    eprintln!("{t:?}: a warm cluster mget_into took {many} allocations for 96 keys, {few} for 8");
    assert!(
        many <= few,
        "96 keys took {many} allocations, 8 keys {few}: some grow with the keys"
    );
    assert!(
        many <= CLUSTER_CALL_ALLOCS_MAX,
        "a warm 96-key cluster call took {many} allocations"
    );
    for s in ss {
        s.shutdown();
    }
}

transport_tests!(
    a_warm_mget_into_allocates_nothing_per_key,
    a_warm_cluster_mget_into_allocates_nothing_per_key,
);
