//! A push's updates of one key: overwrite, or a gradient step with the
//! table's optimizer (SGD or Adagrad), in place under the shard's write
//! lock so that each key's update is atomic.

use std::sync::atomic::Ordering;

use fabrickv_engine::{Partition, PutCond, PutResult};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::ps::{f32s_from_le, init_vector, Optimizer};

use super::store::Table;
use super::{ADAGRAD_EPSILON, ADAGRAD_INITIAL_ACCUMULATOR, PS_ITEM_KEY_BYTES};

pub(super) fn put_result(r: PutResult) -> Result<(), ErrorCode> {
    match r {
        PutResult::Stored => Ok(()),
        PutResult::InsufficientSpace => Err(ErrorCode::InsufficientSpace),
        PutResult::TooLarge => Err(ErrorCode::ValueTooLarge),
        PutResult::ConditionFailed => Err(ErrorCode::Internal),
    }
}

/// Writes `state` (f32s) as little-endian bytes over `out`.
pub(super) fn store_f32s(state: &[f32], out: &mut [u8]) {
    for (o, x) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

/// The buffers of a push, kept by the service so that no key allocates.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// The key's state as floats: weights, then Adagrad's accumulator.
    state: Vec<f32>,
    /// The key's gradient, decoded.
    grad: Vec<f32>,
    /// The state as stored (little-endian bytes), for a new item.
    bytes: Vec<u8>,
}

impl Scratch {
    /// Encodes `state` into `bytes` and stores it as the key's value.
    fn put_state(&mut self, p: &mut Partition, h: KeyHash, k: &[u8], now_ms: u64) -> PutResult {
        self.bytes.clear();
        self.bytes.resize(self.state.len() * 4, 0);
        store_f32s(&self.state, &mut self.bytes);
        p.put(h, k, &self.bytes, 0, PutCond::Always, now_ms)
    }
}

/// Stores `v` as the key's vector (optimizer state reset).
pub(super) fn overwrite(
    t: &Table,
    p: &mut Partition,
    h: KeyHash,
    k: &[u8],
    v: &[u8],
    s: &mut Scratch,
    now_ms: u64,
) -> Result<(), ErrorCode> {
    // The partition's item count tells a new key from a replaced one
    // without a second lookup.
    let items_before = p.item_count();
    let r = match t.spec.optimizer {
        Optimizer::Sgd => p.put(h, k, v, 0, PutCond::Always, now_ms),
        Optimizer::Adagrad => {
            let dim = t.spec.dim as usize;
            s.state.clear();
            s.state.resize(dim * 2, ADAGRAD_INITIAL_ACCUMULATOR);
            f32s_from_le(v, &mut s.state[..dim]);
            s.put_state(p, h, k, now_ms)
        }
    };
    put_result(r)?;
    if p.item_count() > items_before {
        t.items.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Applies gradient `g` to the key's vector with the table's optimizer; an
/// absent key starts from the initializer.
pub(super) fn apply_gradient(
    t: &Table,
    p: &mut Partition,
    h: KeyHash,
    k: &[u8],
    g: &[u8],
    s: &mut Scratch,
    now_ms: u64,
) -> Result<(), ErrorCode> {
    let dim = t.spec.dim as usize;
    let lr = t.spec.lr;
    s.grad.clear();
    s.grad.resize(dim, 0.0);
    f32s_from_le(g, &mut s.grad);
    let state_len = dim * t.spec.optimizer.state_per_element();
    s.state.clear();
    s.state.resize(state_len, 0.0);
    if let Some(bytes) = p.value_mut(h, k, now_ms) {
        if bytes.len() == state_len * 4 {
            f32s_from_le(bytes, &mut s.state);
            step(t.spec.optimizer, lr, &mut s.state, &s.grad);
            store_f32s(&s.state, bytes);
            return Ok(());
        }
    }
    init_vector(t.spec.seed, key_of_slice(k), &mut s.state[..dim]);
    if t.spec.optimizer == Optimizer::Adagrad {
        s.state[dim..].fill(ADAGRAD_INITIAL_ACCUMULATOR);
    }
    step(t.spec.optimizer, lr, &mut s.state, &s.grad);
    put_result(s.put_state(p, h, k, now_ms))?;
    t.items.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// The u64 key inside an item key.
pub(super) fn key_of_slice(k: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&k[4..PS_ITEM_KEY_BYTES]);
    u64::from_le_bytes(b)
}

/// One optimizer step over `state` (weights, then Adagrad's accumulator).
#[inline]
pub(super) fn step(opt: Optimizer, lr: f32, state: &mut [f32], g: &[f32]) {
    let dim = g.len();
    match opt {
        Optimizer::Sgd => {
            for (w, gi) in state[..dim].iter_mut().zip(g) {
                *w -= lr * gi;
            }
        }
        Optimizer::Adagrad => {
            let (w, acc) = state.split_at_mut(dim);
            for ((wi, ai), gi) in w.iter_mut().zip(acc.iter_mut()).zip(g) {
                *ai += gi * gi;
                *wi -= lr * gi / (ai.sqrt() + ADAGRAD_EPSILON);
            }
        }
    }
}
