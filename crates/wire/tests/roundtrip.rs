//! Property tests: any batch the builder writes decodes to the same batch,
//! and no byte string makes the decoders panic.

use fabrickv_types::ErrorCode;
use fabrickv_wire::{
    decode_frame, PutCondition, RequestBuilder, RequestIter, ResponseBuilder, ResponseIter,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum TestOp {
    Get(Vec<u8>),
    Put(Vec<u8>, Vec<u8>, u64, u8),
    Delete(Vec<u8>),
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..=250)
}

fn test_op() -> impl Strategy<Value = TestOp> {
    prop_oneof![
        key().prop_map(TestOp::Get),
        (
            key(),
            prop::collection::vec(any::<u8>(), 0..600),
            0u64..1_000_000,
            0u8..3
        )
            .prop_map(|(k, v, t, c)| TestOp::Put(k, v, t, c)),
        key().prop_map(TestOp::Delete),
    ]
}

fn cond(c: u8) -> PutCondition {
    match c {
        1 => PutCondition::IfAbsent,
        2 => PutCondition::IfPresent,
        _ => PutCondition::Always,
    }
}

/// Appends one request frame holding `ops`, in order.
fn write_request(buf: &mut Vec<u8>, id: u64, worker: u16, ops: &[TestOp]) {
    let mut b = RequestBuilder::new(buf, id, worker);
    for op in ops {
        match op {
            TestOp::Get(k) => b.get(k),
            TestOp::Put(k, v, t, c) => b.put(k, v, *t, cond(*c)),
            TestOp::Delete(k) => b.delete(k),
        };
    }
    b.finish();
}

proptest! {
    #[test]
    fn request_batches_round_trip(ops in prop::collection::vec(test_op(), 0..64), id in any::<u64>(), worker in any::<u16>()) {
        let mut buf = vec![0xEE; 3]; // frames may start mid-buffer
        write_request(&mut buf, id, worker, &ops);
        let f = decode_frame(&buf[3..]).expect("builder output decodes");
        prop_assert_eq!(f.header.request_id, id);
        prop_assert_eq!(f.header.worker, worker);
        let got: Vec<_> = RequestIter::new(&f).expect("structure").collect();
        prop_assert_eq!(got.len(), ops.len());
        for (g, want) in got.iter().zip(&ops) {
            let (code, c) = g.check().expect("valid op");
            match want {
                TestOp::Get(k) => { prop_assert_eq!(code, fabrickv_wire::OpCode::Get); prop_assert_eq!(g.key, &k[..]); }
                TestOp::Put(k, v, t, cc) => {
                    prop_assert_eq!(code, fabrickv_wire::OpCode::Put);
                    prop_assert_eq!((g.key, g.value, g.ttl_ms, c), (&k[..], &v[..], *t, cond(*cc)));
                }
                TestOp::Delete(k) => { prop_assert_eq!(code, fabrickv_wire::OpCode::Delete); prop_assert_eq!(g.key, &k[..]); }
            }
        }
    }

    #[test]
    fn responses_round_trip(results in prop::collection::vec((0u16..19, prop::collection::vec(any::<u8>(), 0..300)), 0..64)) {
        let mut buf = Vec::new();
        let mut b = ResponseBuilder::new(&mut buf, 1, 0);
        for (s, v) in &results {
            b.result(ErrorCode::from_u16(*s).expect("known code"), v);
        }
        b.finish();
        let f = decode_frame(&buf).expect("frame");
        let got: Vec<_> = ResponseIter::new(&f).expect("structure").collect();
        prop_assert_eq!(got.len(), results.len());
        for (g, (s, v)) in got.iter().zip(&results) {
            prop_assert_eq!(g.status, *s);
            prop_assert_eq!(g.value, &v[..]);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(f) = decode_frame(&bytes) {
            if let Ok(it) = RequestIter::new(&f) { for op in it { let _ = op.check(); } }
            if let Ok(it) = ResponseIter::new(&f) { for r in it { let _ = r.code(); } }
        }
    }

    #[test]
    fn corrupting_a_valid_frame_never_panics(ops in prop::collection::vec(test_op(), 1..8), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut buf = Vec::new();
        write_request(&mut buf, 1, 0, &ops);
        for (at, x) in flips {
            let i = at % buf.len();
            buf[i] ^= x | 1;
        }
        if let Ok(f) = decode_frame(&buf) {
            if let Ok(it) = RequestIter::new(&f) { for op in it { let _ = op.check(); } }
        }
    }
}
