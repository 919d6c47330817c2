//! Issue 30 (part 3), "the client allocates per key": a warm `mget_into`
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

use fabrickv_client::{Client, Kv, MgetBuf};

use common::{keys_of_worker, value_of, TestServer, Transport};

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
    let mut call = |keys: &[Vec<u8>], buf: &mut MgetBuf| {
        allocations(|| c.mget_into(keys, buf).expect("mget_into"))
    };
    // Warm: the buffer, the connections' queues and buffers grow to size.
    for _ in 0..4 {
        call(&keys, &mut buf);
        call(&small, &mut buf);
    }
    let mut many = Vec::new();
    let mut few = Vec::new();
    for _ in 0..5 {
        many.push(call(&keys, &mut buf));
        few.push(call(&small, &mut buf));
    }
    call(&keys, &mut buf);
    call(&keys, &mut buf);
    for (i, k) in keys.iter().enumerate() {
        let want = (i % 4 != 3).then(|| value_of(i as u64, i * 37 % 501));
        assert_eq!(buf.get(i), want.as_deref(), "key {k:?}");
    }
    let (many, few) = (many.iter().min(), few.iter().min());
    let (Some(&many), Some(&few)) = (many, few) else {
        unreachable!("five calls each")
    };
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

transport_tests!(a_warm_mget_into_allocates_nothing_per_key);
